"""`DataModule`: what every datamodule gives the pipeline. `InMemoryImageDataModule`: datasets
that fit in memory, whose subclass says how to read its files (`load_split`) and what the data is
(`source`, `input_shape`, `class_names`, `mean`, `std`). The rest is shared: find or download the
files, decode them once to uint8 tensors (cached), carve a validation split (seeded by
`split_seed` alone: it stays put while run seeds vary), and serve whole batches from tensors on
the training device (`TensorBatchLoader`, no workers). Data that does not fit: `image_folder.py`."""

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import lightning as L
import torch

from litforge.data.images import normalize, seeded
from litforge.data.loaders import BatchAugment, EpochShuffler, TensorBatchLoader
from litforge.data.sources import DatasetSource, locate
from litforge.errors import UserError, check_number

log = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the cached tensors change meaning
CACHE = "decoded-uint8.pt"
MIXES = ("mixup", "cutmix", "both")


def check_choice(key: str, value: object, choices: Sequence[str]) -> None:
    if value is not None and value not in choices:
        raise UserError(f"data.{key}={value} is not one of: {', '.join(choices)}, null.")


def check_folds(num_folds: int | None, fold: int) -> None:
    if num_folds is not None:
        check_number("data.num_folds", num_folds, integer=True, minimum=2)
    if num_folds is not None and fold not in range(num_folds):
        raise UserError(
            f"data.fold={fold} is not a fold of data.num_folds={num_folds}: give 0 to "
            f"{num_folds - 1} (all of them: -m data.fold={','.join(map(str, range(num_folds)))})."
        )


def fold_split(labels: Sequence[int], num_folds: int, fold: int, seed: int):
    """Indices of the training and the validation samples of fold `fold` (k-fold cross-
    validation): each class's samples, in a seeded order, are dealt round the folds in turn, so
    the `num_folds` validation sets partition the data and hold each class's share."""
    labels = torch.as_tensor(labels)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    order = order[torch.argsort(labels[order], stable=True)]  # by class, seeded within one
    folds = torch.empty(len(labels), dtype=torch.long)
    folds[order] = torch.arange(len(labels)) % num_folds
    return (folds != fold).nonzero().squeeze(1), (folds == fold).nonzero().squeeze(1)


class DataModule(L.LightningDataModule):
    """The model is built with `model_arguments()` (checkpoints keep them: a loaded model knows
    its input and classes); `input_shape`, `class_names`, `mean`, `std` are set by `inspect()`.
    A subclass gives each split's batches: `_loader(split, train)`."""

    input_shape: tuple[int, int, int]  # channels, height, width
    class_names: tuple[str, ...]
    mean: Sequence[float]  # per channel, of the training images scaled to [0, 1]
    std: Sequence[float]

    def inspect(self) -> None:
        """Find out the classes, image shape and statistics (once; cheap when repeated)."""

    def model_arguments(self) -> dict[str, object]:
        self.inspect()
        return {
            "input_shape": tuple(self.input_shape),
            "num_classes": len(self.class_names),
            "class_names": self.class_names,
            "mean": list(self.mean),
            "std": list(self.std),
        }

    def example_input(self) -> torch.Tensor:  # what TensorBoard traces the model's graph with
        self.inspect()
        return torch.zeros(2, *self.input_shape)

    # `data.mix`: the training batches of the current epoch blended so far (checkpointed by
    # Lightning through `state_dict`: a run resumed mid-epoch goes on with the same draws).
    mixed = {"epoch": -1, "batches": 0}

    def state_dict(self) -> dict[str, int]:
        return dict(self.mixed) if self.hparams.get("mix") else {}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.mixed = {"epoch": int(state_dict["epoch"]), "batches": int(state_dict["batches"])}

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """`data.mix`: training batches blended by MixUp, CutMix or either (`both`), on the
        device; their labels become per-class probabilities."""
        hp, trainer = self.hparams, self.trainer
        if not hp.get("mix") or trainer is None or not trainer.training:
            return batch
        from torchvision.transforms import v2

        if getattr(self, "_mix", None) is None:
            given = {"alpha": hp.mix_alpha, "num_classes": len(self.class_names)}
            mixes = {"mixup": v2.MixUp(**given), "cutmix": v2.CutMix(**given)}
            mixes["both"] = v2.RandomChoice(list(mixes.values()))
            self._mix = mixes[hp.mix]
        # Seeded by the batch: the batches before it this epoch, resumed runs too.
        epoch = trainer.current_epoch
        batch_index = self.mixed["batches"] if self.mixed["epoch"] == epoch else 0
        self.mixed = {"epoch": epoch, "batches": batch_index + 1}
        with seeded(hp.seed or 0, epoch, batch_index, trainer.global_rank):
            return self._mix(*batch)

    def shard(self) -> dict[str, int]:
        """`num_replicas` and `rank` of this process under DDP; empty otherwise."""
        return (self.trainer.distributed_sampler_kwargs if self.trainer is not None else None) or {}

    def train_dataloader(self):
        return self._loader("train", train=True)

    def val_dataloader(self):
        return self._loader("val", train=False)

    def test_dataloader(self):
        return self._loader("test", train=False)


class InMemoryImageDataModule(DataModule):
    source: ClassVar[DatasetSource]
    num_train_images: ClassVar[int]  # the official training split's size

    def __init__(
        self,
        data_dir: str | None = None,
        root_dir: str = "data",
        system_dir: str | None = "/usr/share/datasets",
        download: bool = True,
        batch_size: int = 128,
        val_size: int = 5000,
        split_seed: int = 0,
        num_folds: int | None = None,
        fold: int = 0,
        crop_padding: int = 0,
        horizontal_flip: bool = False,
        cache: bool = True,
        mix: str | None = None,
        mix_alpha: float = 1.0,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        check_number("data.batch_size", batch_size, integer=True, minimum=1)
        check_choice("mix", mix, MIXES)
        check_number("data.mix_alpha", mix_alpha, above=True)
        check_number("data.val_size", val_size, integer=True, minimum=0)
        check_folds(num_folds, fold)
        check_number("data.crop_padding", crop_padding, integer=True, minimum=0)
        if val_size >= self.num_train_images:
            raise UserError(
                f"val_size={val_size} must be below the {self.num_train_images} training images "
                f"of {self.source.name}."
            )
        # Plain values only: they go into checkpoints, which must load with weights_only=True.
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.save_hyperparameters({"name": self.source.name, **arguments})
        self.splits: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # uint8 images, labels

    def load_split(self, directory: Path, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Read the train or test split from `directory`: uint8 images N×C×H×W, int64 labels N."""
        raise NotImplementedError

    def locate(self, allow_download: bool = False) -> Path:
        hp, download = self.hparams, allow_download and self.hparams.download
        if hp.data_dir is not None:
            return locate(self.source, hp.data_dir, None, download, given=True)
        return locate(self.source, hp.root_dir, hp.system_dir, download)

    def cache_path(self, directory: Path) -> Path:  # under root_dir: the system dir is read-only
        if self.hparams.data_dir is not None:
            return directory / CACHE
        return Path(self.hparams.root_dir).expanduser() / self.source.name / CACHE

    def decode(self, directory: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {s: self.load_split(directory, train=s == "train") for s in ("train", "test")}

    def read_cache(self, directory: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
        path = self.cache_path(directory)
        if not (self.hparams.cache and path.is_file()):
            return None
        try:
            cached = torch.load(path, weights_only=True)
        except Exception as err:  # a damaged cache is rebuilt from the original files
            log.warning("Ignoring unreadable cache %s (%s); decoding the files again.", path, err)
            return None
        if cached.get("format") != CACHE_FORMAT or cached.get("source") != str(directory):
            log.info("Cache %s is from another format or source; decoding the files again.", path)
            return None
        return cached["splits"]

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node: the only place that downloads or writes.
        directory = self.locate(allow_download=True)
        if not self.hparams.cache or self.read_cache(directory) is not None:
            return
        path, splits = self.cache_path(directory), self.decode(directory)
        cached = {"format": CACHE_FORMAT, "source": str(directory), "splits": splits}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".pt.partial")
            torch.save(cached, partial)
            partial.replace(path)  # atomic: a reader sees the old cache or the new one
        except OSError as err:  # a read-only data dir only costs the next run the decoding time
            log.warning("Could not cache decoded tensors at %s: %s", path, err)

    def setup(self, stage: str | None = None) -> None:
        fit = stage in ("fit", "validate", None) and "train" not in self.splits
        test = stage in ("test", "predict", None) and "test" not in self.splits
        if not (fit or test):
            return
        directory = self.locate()
        cached = self.read_cache(directory)
        if self.trainer is None or self.trainer.is_global_zero:
            copy = f" (decoded copy: {self.cache_path(directory)})" if cached else ""
            log.info(f"Data: {self.source.name} from {directory}{copy}")
        decoded = cached or self.decode(directory)
        if test:
            self.splits["test"] = decoded["test"]
        if fit:
            images, labels = decoded["train"]
            hp, n_val = self.hparams, self.hparams.val_size
            if hp.num_folds:  # k-fold: validation is fold `fold` of the whole training split
                train, val = fold_split(labels, hp.num_folds, hp.fold, hp.split_seed)
            elif n_val >= len(labels):
                raise UserError(
                    f"val_size={n_val} leaves no training data: {directory} holds "
                    f"{len(labels)} training images. Use a smaller val_size."
                )
            else:
                generator = torch.Generator().manual_seed(hp.split_seed)
                order = torch.randperm(len(labels), generator=generator)
                train, val = order[n_val:], order[:n_val]
            self.splits["val"] = (images[val], labels[val])
            self.splits["train"] = (images[train], labels[train])

    def _loader(self, split: str, train: bool) -> TensorBatchLoader:
        hp, mean, std, trainer = self.hparams, self.mean, self.std, self.trainer
        images, labels = self.splits[split]
        device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        if device.type == "cpu":  # normalized once, instead of once per batch
            images = normalize(images, torch.tensor(mean), torch.tensor(std))
        black = [-m / s for m, s in zip(mean, std, strict=True)]
        augment = BatchAugment(hp.crop_padding, hp.horizontal_flip, black) if train else None
        sampler = EpochShuffler(len(labels), train, seed=hp.seed or 0, **self.shard())
        images, labels = images.to(device), labels.to(device)
        return TensorBatchLoader(images, labels, hp.batch_size, sampler, mean, std, augment)
