"""JSON Schemas of conf/ for editors, made from the constructors the configs name."""
