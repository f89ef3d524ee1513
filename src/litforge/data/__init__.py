"""Datasets: one module per dataset (`mnist`, `fashion_mnist`, `cifar10`), each with its
datamodule; `base.py` is what they share, `sources.py` where their files come from."""
