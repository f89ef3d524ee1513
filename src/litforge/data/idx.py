"""The IDX files of MNIST and Fashion-MNIST, gzipped or not: a big-endian header (two zero bytes,
a type code, the number of dimensions, one uint32 per dimension), then the array. Both datasets
store uint8 (type code 0x08, the only one read here): images N×28×28, labels N."""

import gzip
import math
import struct
from pathlib import Path

import numpy as np
import torch

from litforge.data.base import InMemoryImageDataModule
from litforge.data.sources import find_file
from litforge.errors import UserError


class IDXFormatError(UserError):
    """A file is not a valid IDX file."""


def read_idx(path: str | Path) -> torch.Tensor:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as err:  # gzip raises these for truncated or non-gzip files
        raise IDXFormatError(f"cannot read {path}: {err}. Replace the file.") from err
    if len(data) < 4 or data[:3] != b"\x00\x00\x08":
        raise IDXFormatError(
            f"{path} is not an IDX file of uint8 (bad magic number {data[:4].hex() or 'none'}). "
            "Replace it with the dataset's original file."
        )
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IDXFormatError(f"{path} is truncated inside its header. Replace the file.")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    expected = header + math.prod(shape)
    if len(data) != expected:
        raise IDXFormatError(
            f"{path} has {len(data)} bytes, its header {shape} needs {expected}: the file is "
            "truncated or damaged. Replace it."
        )
    return torch.from_numpy(np.frombuffer(data, np.uint8, offset=header).reshape(shape).copy())


class IDXDataModule(InMemoryImageDataModule):
    input_shape = (1, 28, 28)
    num_train_images = 60000
    split_files = {
        True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    }

    def load_split(self, directory: Path, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        image_path, label_path = (find_file(directory, f) for f in self.split_files[train])
        images, labels = read_idx(image_path), read_idx(label_path)
        if images.ndim != 3 or tuple(images.shape[1:]) != self.input_shape[1:]:
            raise IDXFormatError(
                f"{image_path} holds images of shape {tuple(images.shape)}, expected "
                f"N×{self.input_shape[1]}×{self.input_shape[2]}. Replace the file."
            )
        if labels.ndim != 1 or len(labels) != len(images):
            raise IDXFormatError(
                f"{label_path} has {labels.shape[0] if labels.ndim else 0} labels for "
                f"{len(images)} images in {image_path}: the files do not belong together."
            )
        if labels.numel() and int(labels.max()) >= len(self.class_names):
            raise IDXFormatError(
                f"{label_path} has label {int(labels.max())}, the dataset has "
                f"{len(self.class_names)} classes. Replace the file."
            )
        return images.unsqueeze(1).contiguous(), labels.long()
