"""litforge: a PyTorch Lightning + Hydra template for image classification."""

__version__ = "0.1.0"
