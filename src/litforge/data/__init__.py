"""Datasets: one module per dataset (`mnist`, `fashion_mnist`), each with its datamodule."""

from litforge.data.base import InMemoryImageDataModule
from litforge.data.sources import DatasetNotFoundError, DatasetSource, locate

__all__ = ["DatasetNotFoundError", "DatasetSource", "InMemoryImageDataModule", "locate"]
