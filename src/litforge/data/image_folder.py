"""Your own images: `data=image_folder data.root=DIR`.

    DIR/train/<class>/<image>     class names are the folder names, sorted
    DIR/val/<class>/<image>       optional: else carved from train (stratified, seeded)
    DIR/test/<class>/<image>      optional: likewise
    DIR/<class>/<image>           or this alone, all three splits carved from it

Only the file list is held in memory: a torch DataLoader's workers decode each image
(`ImageFiles`, `images.SampleTransform`); batches travel as uint8 to the training device. The
path to copy for data that does not fit in memory. A bad folder stops the run in `inspect()`,
before the model is built; a file that does not decode stops it (`on_bad_file="error"`) or is
left out."""

import logging
import os
from pathlib import Path
from typing import Annotated, Literal

import torch
from annotated_types import Ge, doc
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from litforge.data.base import DataModule, Mix, fold_split
from litforge.data.images import (
    IMAGE_SUFFIXES,
    MAX_IMAGE_PIXELS,
    AutoAugment,
    BadImageError,
    CropScale,
    ImageSize,
    Interpolation,
    SampleTransform,
)
from litforge.data.samplers import EpochSampler, evaluation_sampler
from litforge.errors import UserError
from litforge.settings import Fraction, NonNegativeInt, Positive, PositiveInt

log = logging.getLogger(__name__)
info_on_rank_zero = rank_zero_only(log.info)  # (each process of a job reads the folder)

SPLITS = ("train", "val", "test")
# What null settings mean: what networks pretrained on ImageNet take.
DEFAULT_CHANNELS, DEFAULT_IMAGE_SIZE = 3, 224
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

Files = dict[str, list[Path]]  # class name -> image files


def default_statistics(channels: int) -> tuple[list[float], list[float]]:
    """ImageNet's mean and standard deviation per channel (gray: their averages)."""
    if channels == 3:
        return list(IMAGENET_MEAN), list(IMAGENET_STD)
    return [round(sum(IMAGENET_MEAN) / 3, 4)], [round(sum(IMAGENET_STD) / 3, 4)]


def is_image(entry: os.DirEntry) -> bool:
    # Hidden files are no images: macOS leaves `._IMG_1.jpg` metadata beside copied photos.
    name = entry.name
    return not name.startswith(".") and name.lower().endswith(IMAGE_SUFFIXES) and entry.is_file()


def cannot_decode(bad: str, skip: str = "data.on_bad_file=skip") -> UserError:
    return UserError(
        f"cannot decode {bad}: fix or remove the file, or set {skip} to leave such files out."
    )


def scan_split(folder: Path) -> Files:
    with os.scandir(folder) as entries:
        entries = sorted(entries, key=lambda e: e.name)
    if stray := [e.name for e in entries if is_image(e)]:
        raise UserError(
            f"{folder} holds images outside class folders ({stray[0]}, ...): put each image "
            f"into {folder}/<class name>/."
        )
    files: Files = {}
    for entry in entries:
        if not entry.is_dir() or entry.name.startswith("."):
            continue
        with os.scandir(entry.path) as images:
            files[entry.name] = sorted(Path(e.path) for e in images if is_image(e))
        if not files[entry.name]:
            raise UserError(
                f"class folder {entry.path} holds no images ({', '.join(IMAGE_SUFFIXES)}): add "
                f"images or remove the folder."
            )
    return files


def scan(root: Path, named: str) -> dict[str, Files]:
    if not root.is_dir():
        raise UserError(
            f"{named} is no folder: point it at one of <class>/<image> or train/<class>/<image>."
        )
    with os.scandir(root) as entries:
        folders = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    classes = [f for f in folders if f not in SPLITS]
    if classes == folders:  # the flat layout: root/<class>/<image>
        splits = {"train": scan_split(root)}
    elif "train" not in folders:
        raise UserError(
            f"{named} has no train/ folder: expected {root}/train/<class>/<image> "
            f"(and optionally val/ and test/ alike)."
        )
    elif classes:
        raise UserError(
            f"{named} holds train/ and other folders beside it ({classes[0]}, ...): move "
            f"class folders into {root}/train/, or all out of train/ (and val/, test/)."
        )
    else:
        splits = {s: scan_split(root / s) for s in SPLITS if s in folders}
    if not splits["train"]:
        raise UserError(
            f"{named} holds no images: expected {root}/<class>/<image> or "
            f"{root}/train/<class>/<image> with images ending in {', '.join(IMAGE_SUFFIXES)}."
        )
    if len(splits["train"]) == 1:
        folder = root / "train" if "train" in folders else root
        raise UserError(
            f"{named} has one class folder, {folder / next(iter(splits['train']))}: a classifier "
            f"needs two or more, one folder of images per class in {folder}."
        )
    for split, files in splits.items():
        if unknown := sorted(set(files) - set(splits["train"])):
            raise UserError(
                f"{root / split} has classes the train split lacks: {', '.join(unknown)}. "
                f"Add their images to {root / 'train'} or remove them from {root / split}."
            )
    return splits


def carve(files: Files, fractions: dict[str, float], seed: int) -> dict[str, Files]:
    """Carve `fractions` ({"val": 0.1}) of each class's files from train, seeded and stratified."""
    generator = torch.Generator().manual_seed(seed)
    carved: dict[str, Files] = {"train": {}, **{split: {} for split in fractions}}
    for name, paths in files.items():
        order = torch.randperm(len(paths), generator=generator).tolist()
        start = 0
        for split, fraction in fractions.items():
            n = round(fraction * len(paths))
            carved[split][name] = [paths[i] for i in sorted(order[start : start + n])]
            start += n
        if start >= len(paths):
            shares = ", ".join(f"data.{split}_fraction={f}" for split, f in fractions.items())
            raise UserError(
                f"class '{name}' has {len(paths)} training image(s): {shares} leave(s) it none "
                f"to train on. Add images, or lower the fractions."
            )
        carved["train"][name] = [paths[i] for i in sorted(order[start:])]
    return carved


def fold_files(files: Files, hp) -> tuple[Files, Files]:
    """The training and validation files of fold `hp.fold` of `hp.num_folds`, stratified."""
    names, split = list(files), ({name: [] for name in files}, {name: [] for name in files})
    flat = [(label, path) for label, paths in enumerate(files.values()) for path in paths]
    parts = fold_split([label for label, _ in flat], hp.num_folds, hp.fold, hp.split_seed)
    for part, indices in zip(split, parts, strict=True):
        for i in indices.tolist():
            part[names[flat[i][0]]].append(flat[i][1])
    return split


class ImageFiles(Dataset):
    """Image files decoded one at a time, in the DataLoader's workers. In training an item is
    (index, key, epoch) (`EpochSampler(keyed=True)`), which seeds the sample's random
    transforms; else an index. A sample is (uint8 image, label, None), or (None, label,
    "path (why)") for a file that does not decode: `collate_files` leaves it out of the batch."""

    def __init__(self, paths: list[Path], labels: list[int], transform: SampleTransform) -> None:
        self.paths, self.labels, self.transform = paths, labels, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, item: int | tuple[int, int, int]):
        index, key, epoch = item if isinstance(item, tuple) else (item, item, 0)
        path, label = self.paths[index], self.labels[index]
        try:
            return self.transform(path.read_bytes(), key, epoch), label, None
        except (BadImageError, OSError) as err:
            return None, label, f"{path} ({err})"


def collate_files(samples: list[tuple]) -> tuple[torch.Tensor | None, torch.Tensor | None, list]:
    """A batch of `ImageFiles` samples: the images that decoded, their labels, the bad files."""
    good = [(image, label) for image, label, _ in samples if image is not None]
    bad = [why for _, _, why in samples if why is not None]
    if not good:
        return None, None, bad
    images, labels = zip(*good, strict=True)
    return torch.stack(images), torch.tensor(labels), bad


class ImageDataModule(DataModule):
    """What datamodules of image files share once their files are found. `inspect()`
    sets `class_names`, `channels`, `image_size`, `mean`, `std`, `train_counts` (per class)."""

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return self.channels, self.image_size, self.image_size

    @property
    def class_weights(self) -> list[float] | None:
        """`balance=loss`: 1 for a class of the mean count, more for rarer ones."""
        if self.hparams.balance != "loss":
            return None
        total, k = sum(self.train_counts), len(self.train_counts)
        return [round(total / (k * max(n, 1)), 6) for n in self.train_counts]

    def log_class_counts(self) -> None:
        counts = ", ".join(
            f"{n} {c}" for c, n in zip(self.class_names, self.train_counts, strict=True)
        )
        how = {"none": "", "sampler": " (balanced by sampling)", "loss": " (balanced in the loss)"}
        info_on_rank_zero(f"Training images per class{how[self.hparams.balance]}: {counts}")

    def sample_transform(self, train: bool) -> SampleTransform:
        hp = self.hparams
        return SampleTransform(
            self.channels, self.image_size, train, hp.crop_scale, hp.horizontal_flip,
            hp.seed or 0, hp.get("auto_augment"), hp.get("interpolation", "bilinear"),
            hp.get("max_image_pixels", MAX_IMAGE_PIXELS),
        )  # fmt: skip

    def pin_memory(self) -> bool:
        on_gpu = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        return on_gpu if self.hparams.pin_memory is None else self.hparams.pin_memory


ROOT = "the folder of your images: <folder>/<class>/<image>, or <folder>/train/<class>/<image>"


class ImageFolderDataModule(ImageDataModule):
    root_setting = "data.root={}"  # how messages name it (`optimize` names its argument)

    def __init__(
        self,
        root: Annotated[str, doc(ROOT)],
        image_size: ImageSize | None = None,
        channels: Literal[1, 3] | None = None,
        batch_size: PositiveInt = 64,
        val_fraction: Fraction = 0.1,
        test_fraction: Fraction = 0.1,
        split_seed: int = 0,
        num_folds: Annotated[int, Ge(2)] | None = None,
        fold: NonNegativeInt = 0,
        crop_scale: CropScale | None = None,
        horizontal_flip: bool = False,
        auto_augment: AutoAugment | None = None,
        interpolation: Interpolation | None = None,
        mix: Mix | None = None,
        mix_alpha: Positive = 1.0,
        mean: list[float] | None = None,
        std: list[Positive] | None = None,
        num_workers: NonNegativeInt = 2,
        pin_memory: bool | None = None,
        on_bad_file: Literal["error", "skip"] = "error",
        balance: Literal["none", "sampler", "loss"] = "none",
        max_image_pixels: PositiveInt = MAX_IMAGE_PIXELS,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        interpolation = interpolation or "bilinear"  # null: a checkpoint's (eval.py), else this
        crop_scale = None if crop_scale is None else tuple(crop_scale)
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        arguments["root"] = str(Path(root).expanduser().resolve())
        self.save_hyperparameters({"name": "image_folder", **arguments})
        self.splits: dict[str, Files] | None = None

    def inspect(self) -> None:
        if self.splits is not None:
            return
        hp = self.hparams
        root = Path(hp.root)
        found = scan(root, self.root_setting.format(root))
        missing = {s: hp[f"{s}_fraction"] for s in ("val", "test") if s not in found}
        self.splits = {**found, **carve(found["train"], missing, hp.split_seed)}
        if hp.num_folds:  # k-fold: the train and val images together are the folds
            train, val = self.splits["train"], self.splits["val"]
            pool = {name: sorted(paths + val.get(name, [])) for name, paths in train.items()}
            self.splits["train"], self.splits["val"] = fold_files(pool, hp)
        self.class_names = tuple(self.splits["train"])
        self.train_counts = [len(self.splits["train"][c]) for c in self.class_names]
        given = len(hp.mean) if hp.mean and len(hp.mean) in (1, 3) else DEFAULT_CHANNELS
        self.channels = hp.channels or given  # null: as data.mean, else RGB
        self.image_size = hp.image_size or DEFAULT_IMAGE_SIZE
        self.mean, self.std = default_statistics(self.channels)
        if hp.mean is not None:
            self.mean, self.std = list(hp.mean), list(hp.std)
        sizes = ", ".join(f"{s} {sum(map(len, self.splits[s].values()))}" for s in SPLITS)
        carved = f" ({' and '.join(missing)} carved from train)" if missing else ""
        carved += f" (val: fold {hp.fold} of {hp.num_folds})" if hp.num_folds else ""
        info_on_rank_zero(
            f"Data: image_folder from {root}: {len(self.class_names)} classes, "
            f"{self.channels}×{self.image_size}×{self.image_size}; images: {sizes}{carved}"
        )
        self.log_class_counts()

    def split_sizes(self) -> dict[str, tuple[int, str]]:
        self.inspect()
        return {
            split: (
                sum(map(len, self.splits[split].values())),
                f"data.{split}_fraction, or a {split}/ folder",
            )
            for split in ("val", "test")
        }

    def setup(self, stage: str | None = None) -> None:
        self.inspect()
        for split, needed in (("val", stage in ("fit", "validate")), ("test", stage == "test")):
            if needed and not any(self.splits[split].values()):
                raise UserError(
                    f"no {split} images: {self.hparams.root} has no {split}/ folder and "
                    f"data.{split}_fraction={self.hparams[f'{split}_fraction']}. Set "
                    f"data.{split}_fraction above 0 or add {split}/<class>/ images."
                )

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        """Files that did not decode stop the run (`on_bad_file=error`) or are left out."""
        if isinstance(batch, torch.Tensor):  # the model's example input (a logger's graph)
            return batch
        images, labels, bad = batch
        if bad and self.hparams.on_bad_file == "error":
            raise cannot_decode(bad[0])
        if images is None:  # no batch to give: under DDP the processes would fall out of step
            raise UserError(
                f"none of the {len(bad)} files of a batch decodes (e.g. {bad[0]}): the folder "
                f"looks damaged."
            )
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        for line in bad:
            self.skipped = (epoch, self.skipped[1] + 1 if self.skipped[0] == epoch else 1)
            log.warning(f"Left out {line} ({self.skipped[1]} this epoch; data.on_bad_file=skip)")
        return images, labels

    skipped = (0, 0)  # (epoch, files left out in it)

    def loader(self, split: str, train: bool) -> DataLoader:
        hp = self.hparams
        files = self.splits[split]
        paths = [p for c in self.class_names for p in files.get(c, [])]
        labels = [i for i, c in enumerate(self.class_names) for _ in files.get(c, [])]
        if train:
            weights = None
            if hp.balance == "sampler":
                weights = torch.tensor([1 / self.train_counts[i] for i in labels])
            sampler = EpochSampler(
                len(paths), seed=hp.seed or 0, weights=weights, keyed=True, **self.shard()
            )
            sampler.set_epoch(self.training_epoch())
            self.train_sampler = sampler
        else:
            sampler = evaluation_sampler(len(paths), **self.shard())
        return StatefulDataLoader(
            ImageFiles(paths, labels, self.sample_transform(train)),
            batch_size=hp.batch_size,
            sampler=sampler,
            # Batch norm cannot train on a last batch of one image.
            drop_last=train and len(sampler) > 1 and len(sampler) % hp.batch_size == 1,
            collate_fn=collate_files,
            num_workers=hp.num_workers,
            pin_memory=self.pin_memory(),
            persistent_workers=hp.num_workers > 0,
            # Its own generator for worker seeds: a resumed run's dropout masks must not shift.
            generator=torch.Generator(),
        )
