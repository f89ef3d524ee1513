"""Datasets, a module each with its datamodule; `base.py` shared, `sources.py` their files."""
