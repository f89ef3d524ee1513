"""litforge: a PyTorch Lightning + Hydra template for image classification. Importing it changes
nothing: the entry points register the config's resolvers (`litforge.runs.register_resolvers`)."""

__version__ = "0.1.0"
