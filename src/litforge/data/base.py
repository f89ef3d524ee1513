"""`ImageClassificationData`: what the pipeline asks of any datamodule. `DataModule`: ours, which
normalize and augment batches on the training device. `InMemoryImageDataModule`: a dataset of
`torchvision.datasets` in memory (MNIST, Fashion-MNIST, CIFAR-10: a subclass names the class and
what the data is: `input_shape`, `class_names`, `mean`, `std`). Data that does not fit:
`image_folder.py`."""

import functools
import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Protocol, runtime_checkable

import lightning as L
import torch
from annotated_types import Ge
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from litforge.data.images import BatchAugment, normalize, seed_of, seeded
from litforge.data.samplers import EpochSampler, evaluation_sampler
from litforge.errors import UserError
from litforge.settings import NonNegativeInt, Positive, PositiveInt

log = logging.getLogger(__name__)

Mix = Literal["mixup", "cutmix", "both"]  # data.mix: MixUp, CutMix or either, per batch


class DatasetNotFoundError(UserError):
    """A built-in dataset's files are not where torchvision reads them (nor downloaded)."""


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


@runtime_checkable
class ImageClassificationData(Protocol):
    """What the pipeline reads off a datamodule to build the model: a plain
    `LightningDataModule` of yours that has these serves (docs/data.md). Its loaders give
    (images, labels) batches, images normalized by `mean` and `std` or left uint8 for
    `DataModule` to normalize."""

    class_names: Sequence[str]
    input_shape: tuple[int, int, int]  # channels, height, width
    mean: Sequence[float]  # per channel, of the training images scaled to [0, 1]
    std: Sequence[float]


def model_arguments(datamodule: L.LightningDataModule) -> dict[str, object]:
    """What the model is built with (checkpoints keep them: a loaded model knows its input and
    classes)."""
    if isinstance(datamodule, DataModule):
        datamodule.inspect()
    if not isinstance(datamodule, ImageClassificationData):
        missing = [n for n in ImageClassificationData.__annotations__ if not hasattr(datamodule, n)]
        raise UserError(
            f"{type(datamodule).__name__} has no {', '.join(missing)}: the pipeline builds the "
            f"model from a datamodule's class_names, input_shape, mean and std (docs/data.md, "
            f"'A datamodule of your own')."
        )
    arguments = {
        "input_shape": tuple(datamodule.input_shape),
        "num_classes": len(datamodule.class_names),
        "class_names": tuple(datamodule.class_names),
        "mean": list(datamodule.mean),
        "std": list(datamodule.std),
    }
    if isinstance(datamodule, DataModule) and datamodule.class_weights is not None:
        arguments["class_weights"] = datamodule.class_weights
    return arguments


class DataModule(L.LightningDataModule):
    """What the pipeline asks of a datamodule (`ImageClassificationData`), found out by
    `inspect()`; each split's `torch.utils.data.DataLoader` from `loader(split, train)`. Batches
    arrive as uint8 images and int64 labels; `on_after_batch_transfer`, on the training device,
    normalizes them (every device alike) and, in training, augments whole batches: a subclass's
    `batch_augment`, then `data.mix`."""

    input_shape: tuple[int, int, int]
    class_names: tuple[str, ...]
    mean: Sequence[float]
    std: Sequence[float]
    class_weights: list[float] | None = None  # of the training loss (data.balance=loss)
    batch_augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None
    stats: list[torch.Tensor] | None = None  # mean and std on the training device

    def inspect(self) -> None:
        """Find out the classes, image shape and statistics (once; cheap when repeated)."""

    def loader(self, split: str, train: bool) -> DataLoader:
        raise NotImplementedError

    def split_sizes(self) -> dict[str, tuple[int, str]]:
        """The images of the val and test splits known once `inspect()` ran, before any is read,
        each with the settings that change it: {"val": (2, "data.val_fraction")}. Each process
        evaluates its own part of a split, and one with none stops the job: the pipeline
        refuses fewer images than processes before the processes start. Empty: not known."""
        return {}

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self.loader("test", train=False)

    def predict_dataloader(self) -> DataLoader:  # `trainer.predict(datamodule=...)`: the test set
        return self.loader("test", train=False)

    def shard(self) -> dict[str, int]:
        """`num_replicas` and `rank` of this process under DDP; empty otherwise."""
        return (self.trainer.distributed_sampler_kwargs if self.trainer is not None else None) or {}

    def training_epoch(self) -> int:
        """The epoch a training loader built now serves first: the one Lightning gives its
        sampler's `set_epoch` next. A loader's workers start reading when Lightning builds it,
        before that call (Lightning #21938): a run resumed from an epoch's end, which restores no
        loader state, would read epoch 0's samples again. So loaders set it on their sampler,
        from the epoch the checkpoint's training sampler had reached when that is later."""
        return max(self.trainer.current_epoch if self.trainer is not None else 0, self.next_epoch)

    # The training batches of the current epoch augmented so far, which seed the next one's
    # draws: checkpointed by Lightning (`state_dict`), so a run resumed mid-epoch draws the same.
    augmented = {"epoch": -1, "batches": 0}
    train_sampler: EpochSampler | None = None  # the training loader's, once built
    next_epoch = 0  # where a checkpoint's training sampler was (`training_epoch`)

    def state_dict(self) -> dict[str, int]:
        sampler = self.train_sampler
        return {**self.augmented, "next_epoch": sampler.state_dict()["epoch"] if sampler else 0}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        if state_dict:  # (empty from checkpoints of data without batch augmentation)
            self.augmented = {k: int(state_dict[k]) for k in ("epoch", "batches")}
            # (Where it starts: a number of a checkpoint's, within the range of torch's seeds.)
            self.next_epoch = min(max(int(state_dict.get("next_epoch", 0)), 0), 2**31)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """The one place a batch is normalized, augmented and mixed, on the training device:
        uint8 images in; float32 images out, `(x / 255 - mean) / std`, with int64 labels, or
        per-class probabilities for a training batch with `data.mix` (docs/data.md)."""
        if isinstance(batch, torch.Tensor):  # the model's example input (a logger's graph)
            return batch
        images, labels = batch
        if self.stats is None or self.stats[0].device != images.device:  # copied there once
            self.stats = [torch.tensor(v, device=images.device) for v in (self.mean, self.std)]
        images = normalize(images, *self.stats)
        trainer, hp = self.trainer, self.hparams
        if trainer is None or not trainer.training:
            return images, labels
        if self.batch_augment is None and not hp.get("mix"):
            return images, labels
        # Seeded by the batch's place: the batches before it this epoch (resumed runs too).
        epoch = trainer.current_epoch
        index = self.augmented["batches"] if self.augmented["epoch"] == epoch else 0
        self.augmented = {"epoch": epoch, "batches": index + 1}
        key = (hp.seed or 0, epoch, index, trainer.global_rank)
        if self.batch_augment is not None:
            generator = torch.Generator(images.device).manual_seed(seed_of(*key))
            images = self.batch_augment(images, generator)
        if hp.get("mix"):  # MixUp, CutMix or either (`both`): labels become probabilities
            with seeded(*key):
                images, labels = self.mix(images, labels)
        return images, labels

    @functools.cached_property
    def mix(self):
        from torchvision.transforms import v2

        given = {"alpha": self.hparams.mix_alpha, "num_classes": len(self.class_names)}
        mixes = {"mixup": v2.MixUp(**given), "cutmix": v2.CutMix(**given)}
        mixes["both"] = v2.RandomChoice(list(mixes.values()))
        return mixes[self.hparams.mix]


class TensorImages(Dataset):
    """uint8 images and labels in memory, on the training device: a batch is one gather
    (`__getitems__`: the DataLoader hands it the batch's indices), no per-sample Python."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.tensor(indices)
        if self.images.device.type == "cuda":  # (pinned: no wait for the GPU)
            index = index.pin_memory().to(self.images.device, non_blocking=True)
        return self.images[index], self.labels[index]


def as_batch(batch):
    """The DataLoader's `collate_fn` where the dataset makes whole batches itself."""
    return batch


class InMemoryImageDataModule(DataModule):
    """A dataset of `torchvision.datasets` (`dataset`: its download, checksums and parsing, its
    folder under `root`) held in memory as the uint8 tensors it reads: a validation split carved
    from the training images (seeded by `split_seed` alone: it stays put while run seeds vary),
    batches gathered from tensors on the training device (`TensorImages`, no workers)."""

    dataset: ClassVar[type]  # torchvision.datasets' class, e.g. MNIST
    name: ClassVar[str]  # as checkpoints and messages name it: the config's name
    folder: ClassVar[str]  # where `dataset` reads its files under root, e.g. MNIST/raw
    num_train_images: ClassVar[int]  # the official training split's size
    debian_package: ClassVar[str | None] = None  # Debian's package of its files, if there is one

    def __init__(
        self,
        root: str = "data",
        download: bool = True,
        batch_size: PositiveInt = 128,
        val_size: NonNegativeInt = 5000,
        split_seed: int = 0,
        num_folds: Annotated[int, Ge(2)] | None = None,
        fold: NonNegativeInt = 0,
        crop_padding: NonNegativeInt = 0,
        horizontal_flip: bool = False,
        mix: Mix | None = None,
        mix_alpha: Positive = 1.0,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        # Plain values only: they go into checkpoints, which must load with weights_only=True.
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.save_hyperparameters({"name": self.name, **arguments})
        self.splits: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # uint8 images, labels
        self.read_in_prepare: dict[bool, tuple[torch.Tensor, torch.Tensor]] = {}
        if crop_padding or horizontal_flip:
            black = [-m / s for m, s in zip(self.mean, self.std, strict=True)]
            self.batch_augment = BatchAugment(crop_padding, horizontal_flip, black)

    def split_sizes(self) -> dict[str, tuple[int, str]]:
        if self.hparams.num_folds:  # (folds of the whole training split: thousands of images)
            return {}
        return {"val": (self.hparams.val_size, "data.val_size")}

    @property
    def root(self) -> Path:
        return Path(self.hparams.root).expanduser()

    def place_files(self) -> None:
        """Put files `dataset` reads into `root` from elsewhere, before it looks (a subclass's:
        Debian's copy of Fashion-MNIST)."""

    def read(self, train: bool, download: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The training or test split as `dataset` reads it: uint8 images N×C×H×W, int64 labels
        N. With `download`, what is missing is downloaded first (nothing is left of a failed
        download); files that are missing or damaged are a UserError."""
        root, folder = self.root, self.root / self.folder
        before = set(root.iterdir()) if root.is_dir() else None
        try:
            dataset = self.dataset(str(root), train=train, download=download)
        except Exception as err:  # torchvision raises many kinds, for files and networks
            if download and root.is_dir():  # its folders and files of the failed download go
                for path in set(root.iterdir()) - (before or set()):
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
                if before is None and not any(root.iterdir()):
                    root.rmdir()
            raise self.not_read(folder, err, download) from None
        images = torch.as_tensor(dataset.data)
        images = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2)
        labels = torch.as_tensor(dataset.targets, dtype=torch.long)
        if tuple(images.shape[1:]) != self.input_shape or len(labels) != len(images):
            raise UserError(
                f"{folder} holds {len(labels)} labels for {len(images)} images of "
                f"{tuple(images.shape[1:])}, {self.name} has images of {self.input_shape}: "
                f"replace the files with the dataset's own."
            )
        if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < len(self.class_names):
            raise UserError(
                f"{folder} holds labels outside 0-{len(self.class_names) - 1}: replace the files "
                f"with the dataset's own."
            )
        return images.contiguous(), labels

    def not_read(self, folder: Path, err: Exception, download: bool) -> UserError:
        """The one line saying why `dataset` found nothing, or nothing it could read."""
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        lines = lines or [type(err).__name__]  # the first line, and the last: a download's cause
        reason = " ".join(dict.fromkeys([lines[0][:200], lines[-1][:200]])).rstrip(".")
        reader = f"torchvision.datasets.{self.dataset.__name__}"
        if not download and "not found" not in reason.lower():
            return UserError(
                f"{folder} holds files {reader} cannot read ({reason}): replace them with the "
                f"dataset's own, or delete {folder} and set data.download=true."
            )
        why = f"its download failed: {reason}" if download else f"{reader}: {reason}"
        fetch = "copy it there from a machine with internet" if download else "data.download=true"
        package = self.debian_package
        debian = f", or install Debian's copy (apt-get install -y {package})" if package else ""
        return DatasetNotFoundError(
            f"{self.name} not found in {folder} ({why}). Put its files there, or set "
            f"data.root=<a folder holding {self.folder}/>{debian}, or {fetch}."
        )

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node: the only place that downloads or writes.
        self.place_files()
        for train in (True, False):  # (what is read here is kept for this process's setup)
            try:
                self.read_in_prepare[train] = self.read(train)
            except DatasetNotFoundError:
                if not self.hparams.download:
                    raise
                self.read_in_prepare[train] = self.read(train, download=True)

    def setup(self, stage: str | None = None) -> None:
        fit = stage in ("fit", "validate", None) and "train" not in self.splits
        test = stage in ("test", "predict", None) and "test" not in self.splits
        if not (fit or test):
            return
        if self.trainer is None or self.trainer.is_global_zero:
            log.info(f"Data: {self.name} from {self.root / self.folder}")
        if test:
            self.splits["test"] = self.read_in_prepare.pop(False, None) or self.read(train=False)
        if fit:
            images, labels = self.read_in_prepare.pop(True, None) or self.read(train=True)
            hp, n_val = self.hparams, self.hparams.val_size
            if hp.num_folds:  # k-fold: validation is fold `fold` of the whole training split
                train, val = fold_split(labels, hp.num_folds, hp.fold, hp.split_seed)
            elif n_val >= len(labels):
                raise UserError(
                    f"data.val_size={n_val} leaves no training data: {self.root / self.folder} "
                    f"holds {len(labels)} training images. Use a smaller val_size."
                )
            else:
                generator = torch.Generator().manual_seed(hp.split_seed)
                order = torch.randperm(len(labels), generator=generator)
                train, val = order[n_val:], order[:n_val]
            self.splits["val"] = (images[val], labels[val])
            self.splits["train"] = (images[train], labels[train])
        self.read_in_prepare = {}  # (a split this stage does not use is not kept)

    def loader(self, split: str, train: bool) -> DataLoader:
        images, labels = self.splits[split]
        device = self.trainer.strategy.root_device if self.trainer else torch.device("cpu")
        dataset = TensorImages(images.to(device), labels.to(device))
        if train:
            sampler = EpochSampler(len(dataset), seed=self.hparams.seed or 0, **self.shard())
            sampler.set_epoch(self.training_epoch())
            self.train_sampler = sampler
        else:
            sampler = evaluation_sampler(len(dataset), **self.shard())
        return StatefulDataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            sampler=sampler,
            collate_fn=as_batch,
            # A generator of its own: each new iterator draws a seed from it, not from torch's
            # global one, which would shift a resumed run's dropout masks.
            generator=torch.Generator(),
        )
