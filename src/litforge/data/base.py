"""A LightningDataModule for image datasets that fit in memory.

Subclasses say how to read their files (`load_split`) and what the data is (`source`, `input_shape`,
`class_names`, `mean`, `std`); this class does the rest the same way for all of them: find or
download the files once, decode them into uint8 tensors, carve a seeded validation split from
the training set, normalize once, and serve batches.
"""

from __future__ import annotations

from typing import ClassVar

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from litforge.data.sources import DatasetSource, locate
from litforge.errors import UserError


class InMemoryImageDataModule(L.LightningDataModule):
    source: ClassVar[DatasetSource]
    input_shape: ClassVar[tuple[int, int, int]]  # channels, height, width
    class_names: ClassVar[tuple[str, ...]]
    mean: ClassVar[tuple[float, ...]]  # per channel, of the training images scaled to [0, 1]
    std: ClassVar[tuple[float, ...]]

    def __init__(
        self,
        data_dir: str = "data",
        system_dir: str | None = "/usr/share/datasets",
        download: bool = True,
        batch_size: int = 128,
        val_size: int = 5000,
        split_seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        if batch_size <= 0:
            raise UserError(f"data.batch_size must be positive, got {batch_size}.")
        if val_size < 0:
            raise UserError(f"data.val_size must be >= 0, got {val_size}.")
        # Plain values only: they go into checkpoints, which must load with weights_only=True.
        self.save_hyperparameters({"name": self.source.name, **_plain(locals())})
        self.data_train: TensorDataset | None = None
        self.data_val: TensorDataset | None = None
        self.data_test: TensorDataset | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def load_split(self, directory, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Read the train or test split from `directory`: uint8 images N×C×H×W, int64 labels N."""
        raise NotImplementedError

    def locate(self, allow_download: bool = False):
        """The directory holding the dataset's files (see `litforge.data.sources`)."""
        hp = self.hparams
        return locate(self.source, hp.data_dir, hp.system_dir, allow_download and hp.download)

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node: the only place that downloads.
        self.locate(allow_download=True)

    def setup(self, stage: str | None = None) -> None:
        directory = self.locate()
        if stage in ("fit", "validate", None) and self.data_train is None:
            images, labels = self.load_split(directory, train=True)
            n_val = self.hparams.val_size
            if n_val >= len(labels):
                raise UserError(
                    f"data.val_size={n_val} leaves no training data: the {self.source.name} "
                    f"training set has {len(labels)} images. Use a smaller data.val_size."
                )
            generator = torch.Generator().manual_seed(self.hparams.split_seed)
            order = torch.randperm(len(labels), generator=generator)
            val_idx, train_idx = order[:n_val], order[n_val:]
            self.data_train = self._dataset(images[train_idx], labels[train_idx])
            self.data_val = self._dataset(images[val_idx], labels[val_idx])
        if stage in ("test", "predict", None) and self.data_test is None:
            self.data_test = self._dataset(*self.load_split(directory, train=False))

    def _dataset(self, images: torch.Tensor, labels: torch.Tensor) -> TensorDataset:
        # Normalize once here rather than per batch: on a CPU the per-batch cost is measurable.
        mean = torch.tensor(self.mean).view(1, -1, 1, 1)
        std = torch.tensor(self.std).view(1, -1, 1, 1)
        return TensorDataset((images.float() / 255 - mean) / std, labels)

    def _loader(self, dataset: TensorDataset | None, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError("setup() has not run for this split")
        hp = self.hparams
        return DataLoader(
            dataset,
            batch_size=hp.batch_size,
            shuffle=shuffle,
            num_workers=hp.num_workers,
            pin_memory=hp.pin_memory,
            persistent_workers=hp.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.data_train, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.data_val, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.data_test, shuffle=False)


def _plain(arguments: dict) -> dict:
    return {k: v for k, v in arguments.items() if k not in ("self", "__class__")}
