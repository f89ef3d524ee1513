"""CIFAR-10: 50k/10k color photos in 10 classes, 3×32×32, as pickles (`cifar-10-batches-py`)."""

import _codecs
import pickle
from pathlib import Path

import numpy as np
import torch

from litforge.data.base import InMemoryImageDataModule
from litforge.data.sources import DatasetSource
from litforge.errors import UserError

FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

CIFAR10 = DatasetSource(
    name="cifar10",
    files=tuple(f"{FOLDER}/{name}" for name in (*TRAIN_BATCHES, "test_batch", "batches.meta")),
    # The archive as torchvision.datasets.CIFAR10 downloads it, checked against its MD5 sum.
    mirrors=("https://www.cs.toronto.edu/~kriz/",),
    resources=(("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"),),
    extract=True,
    aliases=("",),  # torchvision.datasets.CIFAR10(root=data_dir) extracts into data_dir itself
)


class CIFARFormatError(UserError):
    """A file is not a CIFAR-10 batch."""


class _ArraysOnly(pickle.Unpickler):
    """Unpickles arrays, lists, dicts and strings only: a pickle from the internet runs no code."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): np.ndarray.__reduce__(np.zeros(0))[0],
        ("numpy._core.multiarray", "_reconstruct"): np.ndarray.__reduce__(np.zeros(0))[0],
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _codecs.encode,  # how Python 3 writes bytes at protocol 2
    }

    def find_class(self, module: str, name: str):
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}") from None


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch: uint8 images N×3×32×32 (rows of 1024 red, green, blue) and labels."""
    try:
        with path.open("rb") as f:
            batch = _ArraysOnly(f, encoding="latin1").load()
    except FileNotFoundError:
        raise CIFARFormatError(f"{path} is missing: the {FOLDER} folder is incomplete.") from None
    except Exception as err:  # truncated or foreign pickles fail in many ways
        raise CIFARFormatError(
            f"{path} is not a CIFAR-10 batch ({type(err).__name__}: {err}). Replace it with the "
            "original file (python -m litforge.data fetch cifar10)."
        ) from None
    if not isinstance(batch, dict) or "data" not in batch or "labels" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise CIFARFormatError(f"{path} has no 'data' and 'labels' (found {keys}). Replace it.")
    data, labels = batch["data"], np.asarray(batch["labels"])
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.shape[1:] != (3072,):
        shape = getattr(data, "shape", None)
        raise CIFARFormatError(
            f"{path}: 'data' must be uint8 of shape N×3072, found "
            f"{getattr(data, 'dtype', type(data).__name__)} {shape}. Replace the file."
        )
    if labels.shape != (len(data),) or labels.min(initial=0) < 0 or labels.max(initial=0) > 9:
        raise CIFARFormatError(
            f"{path}: {labels.size} labels for {len(data)} images (or labels outside 0-9)."
        )
    return data.reshape(-1, 3, 32, 32), labels


class CIFAR10DataModule(InMemoryImageDataModule):
    source = CIFAR10
    input_shape = (3, 32, 32)
    num_train_images = 50000
    class_names = CLASSES
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)

    def load_split(self, directory: Path, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        folder = directory / FOLDER
        names = TRAIN_BATCHES if train else ("test_batch",)
        batches = [read_batch(folder / name) for name in names]
        images = np.concatenate([images for images, _ in batches])
        labels = np.concatenate([labels for _, labels in batches])
        return torch.from_numpy(images).contiguous(), torch.from_numpy(labels).long()
