"""Bigger than memory or one machine: image folders as streaming shards, with LitData.

    python -m litforge.streaming optimize SRC_DIR OUT_DIR  # once; SRC_DIR/<split>/<class>/<image>
    python train.py data=streaming data.input_dir=OUT_DIR  # OUT_DIR: a folder or s3://bucket/...

`optimize_folder` checks and splits the folder as `data=image_folder` would (the same carved
val/test), checks that every image decodes, then writes each split's encoded files, unchanged (or
with `store="pixels"` their decoded pixels), into chunked shards (`OUT_DIR/<split>/`, LitData's
format) with worker processes, and the classes, counts, shape and mean and std into
`OUT_DIR/litforge.json`.

`StreamingDataModule` reads the shards with LitData's `StreamingDataset` and `StreamingDataLoader`:
chunks are fetched ahead into a local cache of bounded size, each process of a multi-process run
reads its own chunks, and the loader's position is part of Lightning's checkpoints, so a resumed
run goes on mid-epoch. Decoding and augmentation are those of image folders (`images.py`).

litdata is an optional dependency: `pip install -e ".[streaming]"`.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Annotated, Literal

import torch
from annotated_types import doc

from litforge.data.base import Mix
from litforge.data.image_folder import (
    SPLITS,
    ImageDataModule,
    ImageFolderDataModule,
    cannot_decode,
    default_statistics,
)
from litforge.data.images import (
    MAX_IMAGE_PIXELS,
    AutoAugment,
    CropScale,
    ImageSize,
    Interpolation,
    SampleTransform,
)
from litforge.errors import UserError
from litforge.hooks import KeepsTestIndices
from litforge.settings import (
    Fraction,
    NonNegativeInt,
    Positive,
    PositiveInt,
    check_values,
    parameters,
)
from litforge.streaming.samples import shard_sample

log = logging.getLogger(__name__)

META_FILE = "litforge.json"
META_FORMAT = 1
# What a shard sample holds: the image file's bytes (compact: a JPEG stays a JPEG; decoded every
# epoch), or its decoded pixels at the size it was optimized for (no decoding when training: for
# a 224×224 JPEG ~10× the bytes; the random crops can only cut into that size).
Store = Literal["files", "pixels"]


def import_litdata():
    try:
        import litdata
    except ImportError:
        raise UserError(
            'streaming needs LitData, which is not installed: pip install -e ".[streaming]"'
        ) from None
    return litdata


def is_url(path: str) -> bool:
    return "://" in path


# --- writing shards ---------------------------------------------------------------------------


def _write_meta(output: str, meta: dict) -> None:
    if not is_url(output):
        Path(output, META_FILE).write_text(json.dumps(meta, indent=1))
        return
    from litdata.streaming.fs_provider import _get_fs_provider

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / META_FILE
        local.write_text(json.dumps(meta, indent=1))
        _get_fs_provider(output).upload_file(str(local), f"{output.rstrip('/')}/{META_FILE}")


def read_meta(input_dir: str) -> dict:
    """`litforge.json` of a shard folder (local, or downloaded from an object store)."""
    if is_url(input_dir):
        from litdata.streaming.fs_provider import _get_fs_provider

        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / META_FILE
            try:
                _get_fs_provider(input_dir).download_file(
                    f"{input_dir.rstrip('/')}/{META_FILE}", str(local)
                )
                meta = json.loads(local.read_text())
            except Exception as err:  # the clients raise their own types
                raise UserError(
                    f"data.input_dir={input_dir}: cannot read {META_FILE} ({err}). Is it the "
                    f"OUT_DIR of `python -m litforge.streaming optimize`, and are your "
                    f"credentials set?"
                ) from None
    else:
        path = Path(input_dir).expanduser() / META_FILE
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError):
            raise UserError(
                f"data.input_dir={input_dir} holds no streaming shards ({path} is missing or "
                f"broken): make them with `python -m litforge.streaming optimize <image folder> "
                f"{input_dir}`."
            ) from None
    if meta.get("format") != META_FORMAT:
        raise UserError(
            f"{input_dir}/{META_FILE} is from another litforge version (format "
            f"{meta.get('format')}): optimize the image folder again."
        )
    return meta


def flag(argument: str) -> str:
    """How the `optimize` command names an argument of `optimize_folder`."""
    named = {"num_workers": "--workers", "source": "SOURCE", "output": "OUTPUT"}
    return named.get(argument, f"--{argument.replace('_', '-')}")


def optimize_folder(
    source: str,
    output: str,
    val_fraction: Fraction = 0.1,
    test_fraction: Fraction = 0.1,
    split_seed: int = 0,
    on_bad_file: Literal["error", "skip"] = "error",
    chunk_bytes: int | str = "64MB",
    num_workers: PositiveInt | None = None,
    store: Store = "files",
    image_size: ImageSize | None = None,
    channels: Literal[1, 3] | None = None,
    max_image_pixels: PositiveInt = MAX_IMAGE_PIXELS,
) -> None:
    """Write the image folder `source` as streaming shards into `output` (see the module doc).
    `store="pixels"`: decoded uint8 pixels, fitted to `image_size` (default 224),
    instead of the files' bytes: no decoding when training, for more disk (see Store)."""
    given = {flag(name): value for name, value in locals().items()}
    typed = parameters(f"{__name__}.optimize_folder")[0]  # (its annotations)
    check_values(given, {flag(name): p.annotation for name, p in typed.items()})
    litdata = import_litdata()
    if val_fraction + test_fraction >= 1:
        raise UserError(
            "--val-fraction and --test-fraction leave no training images: their sum must be "
            "below 1."
        )
    folder = ImageFolderDataModule(
        root=source,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        split_seed=split_seed,
        on_bad_file=on_bad_file,
        image_size=image_size,
        channels=channels,
        max_image_pixels=max_image_pixels,
    )
    folder.root_setting = "the source folder {}"  # as its messages name it
    local = not is_url(output)
    if local:
        out = Path(output).expanduser()
        if out.exists() and any(out.iterdir()):
            raise UserError(f"{out} exists and is not empty: remove it or choose another folder.")
        output = str(out.resolve())
    else:
        from litdata.streaming.fs_provider import _get_fs_provider

        if not _get_fs_provider(output).is_empty(output):
            raise UserError(f"{output} is not empty: remove what is there or choose another URL.")
    folder.inspect()  # the folder's checks, splits, shape and statistics
    counts, bad = {}, []
    pixels = (folder.channels, folder.image_size) if store == "pixels" else None
    try:
        with tempfile.TemporaryDirectory() as bad_dir:
            for split in SPLITS:
                files = folder.splits[split]
                items = [
                    (str(path), label)
                    for label, name in enumerate(folder.class_names)
                    for path in files.get(name, [])
                ]
                if not items:
                    continue
                # Mixed, not class after class: a shard's chunks are read one after another, so
                # a run would otherwise see a few classes at a time.
                order = torch.randperm(len(items), generator=torch.Generator().manual_seed(0))
                items = [items[i] for i in order.tolist()]
                print(f"{split}: {len(items)} images")
                litdata.optimize(
                    fn=functools.partial(
                        shard_sample, bad_dir=bad_dir, pixels=pixels, max_pixels=max_image_pixels
                    ),
                    inputs=items,
                    output_dir=f"{output.rstrip('/')}/{split}",
                    chunk_bytes=chunk_bytes,
                    num_workers=max(1, min(num_workers or 1, len(items))),
                    mode="overwrite",
                    reorder_files=False,  # keep the mixed order (LitData sorts by file size)
                    # Forked workers start with the parent's imports (torch: seconds each when
                    # spawned); macOS forks unsafely, and keeps LitData's default.
                    start_method="fork" if sys.platform == "linux" else None,
                )
                for report in Path(bad_dir).glob("*.txt"):
                    bad += report.read_text().splitlines()
                    report.unlink()
                if bad and on_bad_file == "error":
                    path, reason = bad[0].split("\t", 1)
                    raise cannot_decode(f"{path} ({reason})", "--on-bad-file skip")
                bad_here = {line.split("\t", 1)[0] for line in bad}
                counts[split] = [
                    sum(str(p) not in bad_here for p in files.get(name, []))
                    for name in folder.class_names
                ]
    except BaseException:
        if local:  # nothing half-written
            shutil.rmtree(output, ignore_errors=True)
        raise
    if bad:
        path, reason = bad[0].split("\t", 1)
        print(f"Left out {len(bad)} files that did not decode, e.g. {path} ({reason})")
    meta = {
        "format": META_FORMAT,
        "source": str(Path(source).expanduser().resolve()),
        "class_names": list(folder.class_names),
        "counts": counts,
        "store": store,
        "channels": folder.channels,
        "image_size": folder.image_size,
        "mean": folder.mean,
        "std": folder.std,
    }
    _write_meta(output, meta)
    print(f"Shards in {output}: {', '.join(f'{s} {sum(n)}' for s, n in counts.items())} images")


# --- reading shards ---------------------------------------------------------------------------


def image_stream_class():
    """`StreamingDataset` that decodes and transforms each sample (defined when first needed:
    litdata is optional). `stored`: the (C, H, W) of shards of pixels, not files."""
    litdata = import_litdata()

    class ImageStream(litdata.StreamingDataset):
        def __init__(
            self, *args, transform: SampleTransform, stored=None, indexed=False, **kwargs
        ) -> None:
            super().__init__(*args, **kwargs)
            self.sample_transform, self.stored = transform, stored
            self.indexed = indexed  # evaluation: each sample with its index (KeepsTestIndices)

        def __getitem__(self, index):
            sample = super().__getitem__(index)
            image = sample["image"]
            if self.stored is not None:
                image = torch.frombuffer(bytearray(image), dtype=torch.uint8).view(self.stored)
            position = int(getattr(index, "index", index))  # a ChunkedIndex when streaming
            image = self.sample_transform(image, position, self.current_epoch)
            return (image, sample["label"], position) if self.indexed else (image, sample["label"])

    return ImageStream


class StreamingDataModule(ImageDataModule, KeepsTestIndices):
    """Train, validate and test on the shards in `input_dir` (see the module doc)."""

    test_indices: list[torch.Tensor]

    def __init__(
        self,
        input_dir: Annotated[str, doc("the OUT_DIR of `python -m litforge.streaming optimize`")],
        image_size: ImageSize | None = None,
        channels: Literal[1, 3] | None = None,
        batch_size: PositiveInt = 64,
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
        cache_dir: str | None = None,
        max_cache_size: str = "50GB",
        balance: Literal["none", "sampler", "loss"] = "none",
        max_image_pixels: PositiveInt = MAX_IMAGE_PIXELS,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        self.test_indices = []  # (KeepsTestIndices: set again for each test in `setup`)
        interpolation = interpolation or "bilinear"  # null: a checkpoint's (eval.py), else this
        crop_scale = None if crop_scale is None else tuple(crop_scale)
        if balance == "sampler":
            raise UserError(
                "balance=sampler needs random access to every sample, which streaming shards "
                "do not give: use balance=loss (class weights in the loss)."
            )
        if not is_url(input_dir):
            input_dir = str(Path(input_dir).expanduser().resolve())
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.save_hyperparameters({"name": "streaming", **arguments})
        self.meta: dict | None = None

    def inspect(self) -> None:
        if self.meta is not None:
            return
        hp = self.hparams
        meta = self.meta = read_meta(hp.input_dir)
        self.class_names = tuple(meta["class_names"])
        self.train_counts = meta["counts"]["train"]
        self.channels = hp.channels or meta["channels"]
        self.image_size = hp.image_size or meta["image_size"]
        if meta.get("store", "files") == "pixels" and self.channels != meta["channels"]:
            raise UserError(
                f"{hp.input_dir} holds {meta['channels']}-channel pixels, data.channels="
                f"{self.channels}: leave data.channels unset, or optimize with --channels "
                f"{self.channels}."
            )
        if hp.mean is not None:
            self.mean, self.std = list(hp.mean), list(hp.std)
        elif self.channels == meta["channels"]:
            self.mean, self.std = meta["mean"], meta["std"]
        else:  # the shards' are for their channels: ImageNet's for these
            self.mean, self.std = default_statistics(self.channels)
        for problem in (
            len(self.mean) != self.channels and "mean",
            len(self.std) != self.channels and "std",
        ):
            if problem:
                raise UserError(
                    f"data.{problem} has {len(getattr(self, problem))} values for "
                    f"{self.channels}-channel images: give one per channel."
                )
        sizes = ", ".join(f"{s} {sum(n)}" for s, n in meta["counts"].items())
        log.info(
            f"Data: streaming from {hp.input_dir}: {len(self.class_names)} classes, "
            f"{self.channels}×{self.image_size}×{self.image_size}; images: {sizes}"
        )
        self.log_class_counts()

    def setup(self, stage: str | None = None) -> None:
        self.inspect()
        self.test_indices = []  # (each test counts from its first batch)
        for split, needed in (("val", stage in ("fit", "validate")), ("test", stage == "test")):
            if needed and split not in self.meta["counts"]:
                raise UserError(
                    f"{self.hparams.input_dir} has no {split} images: optimize the folder again "
                    f"with --{split}-fraction above 0, or with a {split}/ folder in it."
                )
        # LitData gives each worker process its own chunks, so Lightning's warning that a
        # dataset with a length may repeat samples over workers does not apply; nor is how
        # LitData maps its chunks into memory news for a training log.
        warnings.filterwarnings("ignore", message=r".*`IterableDataset` has `__len__` defined")
        logging.getLogger("litdata.streaming.dataset").setLevel(logging.WARNING)

    def loader(self, split: str, train: bool):
        litdata = import_litdata()
        hp = self.hparams
        if split not in self.meta["counts"]:
            raise UserError(
                f"{hp.input_dir} has no {split} shards: optimize a folder that has some."
            )
        meta, size = self.meta, self.meta["image_size"]
        dataset = image_stream_class()(
            f"{hp.input_dir.rstrip('/')}/{split}",
            transform=self.sample_transform(train),
            stored=(meta["channels"], size, size) if meta.get("store") == "pixels" else None,
            cache_dir=hp.cache_dir,
            max_cache_size=hp.max_cache_size,
            shuffle=train,
            seed=0 if hp.seed is None else hp.seed,
            # One item at a time: LitData's default deserializes a window of items around
            # each one read, and shuffled reads in worker processes kept redoing it (3x
            # slower on the exported Fashion-MNIST with 2 workers, benchmarks/data_loading.py).
            batch_decode=False,
            # Training: whole batches only, the same number on every process (DDP needs the
            # same number of steps everywhere; batch norm cannot train on one image). LitData
            # leaves out the rest of each epoch: fewer than processes × batch_size images, other
            # ones each epoch. Evaluation: every image.
            drop_last=train,
            indexed=not train,
        )
        return litdata.StreamingDataLoader(
            dataset,
            batch_size=hp.batch_size,
            num_workers=hp.num_workers,
            pin_memory=self.pin_memory(),
            generator=torch.Generator(),  # see ImageFolderDataModule._loader
        )

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """An evaluation batch's indices kept in a test (`KeepsTestIndices`), then dropped: the
        module gets (images, labels) as from any datamodule."""
        if isinstance(batch, (list, tuple)) and len(batch) == 3:
            images, labels, indices = batch
            if self.trainer is not None and self.trainer.testing:
                self.test_indices.append(indices)
            batch = (images, labels)
        return super().on_after_batch_transfer(batch, dataloader_idx)
