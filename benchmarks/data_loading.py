"""Images per second from image files to normalized float batches, three ways, on the same files:

(a) torchvision's `ImageFolder` + `DataLoader` with per-sample transforms (Resize, CenterCrop,
    ToTensor, Normalize): what users write by hand;
(b) `data=image_folder` (`ImageFolderDataModule`);
(c) `data=streaming` (`StreamingDataModule`) on the shards `python -m litforge.streaming optimize`
    made of the same folder (the files' bytes, the default);
(d) the same on shards of decoded pixels (`optimize --store pixels`): no decoding when training.

Each loads the training split of two workloads, with no worker process and with `--workers`:

- Fashion-MNIST's training images written out as PNG files (60,000 grayscale 28×28), loaded at
  28×28;
- `--jpegs` color 224×224 JPEGs (quality 90) that the benchmark writes, loaded at 224×224.

A pass is one epoch over the training images into batches of 256, normalized (for (b) and (c) by
the datamodule's batch hooks, as a run does on its device; here the CPU). The first
pass warms up (worker start, caches); the median of `--passes` more is reported.

    python benchmarks/data_loading.py                  # both workloads, 0 and 2 workers
    python benchmarks/data_loading.py --workers 4 --jpegs 5000
    python benchmarks/data_loading.py --mix            # only what `data.mix` costs, see below

`--mix` times torchvision's MixUp and CutMix on a training batch of 64 3×160×160 images where
they could run: in a loader worker (one CPU thread, float images: uint8 cannot hold a blend, so
the batch also travels as float32, 4× the bytes) or per batch on the training device after
normalization, as `data.mix` does; and the copy of the batch to the device, uint8 and float32.

Made files are kept in `--data-dir` (default data/benchmarks) for the next run. Without
`litforge.streaming` (a lean copy without the streaming feature, or without litdata), (c) and (d)
are skipped, saying so.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

BATCH = 256
ROOT = Path(__file__).resolve().parents[1]


def write_jpegs(root: Path, n: int, size: int = 224, classes: int = 10) -> Path:
    """`root/train/c<k>/<i>.jpg`: smooth random color images, as compressible as photos."""
    from PIL import Image

    done = root / ".complete"
    if done.is_file() and done.read_text() == str(n):
        return root
    rng = np.random.default_rng(0)
    for i in range(n):
        coarse = rng.integers(0, 256, (size // 16, size // 16, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((size, size), Image.BICUBIC)
        folder = root / "train" / f"c{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{i:06d}.jpg", quality=90)
    done.write_text(str(n))
    return root


def run(command: list[str], module: str) -> None:
    result = subprocess.run([sys.executable, "-m", module, *command])
    if result.returncode != 0:
        sys.exit(result.returncode)


def fashion_mnist_folder(data_dir: Path) -> Path:
    """Fashion-MNIST's training images as `<folder>/train/<class>/<n>.png` (made once)."""
    from PIL import Image

    from litforge.data.fashion_mnist import FashionMNISTDataModule

    folder = data_dir / "fashion_mnist_images"
    if not (folder / "train").is_dir():
        datamodule = FashionMNISTDataModule(root=str(ROOT / "data"))
        datamodule.prepare_data()
        images, labels = datamodule.read(train=True)
        partial = folder.with_name(f"{folder.name}.partial")
        for i, (image, label) in enumerate(zip(images, labels.tolist(), strict=True)):
            (partial / "train" / f"c{label}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(image[0].numpy()).save(partial / "train" / f"c{label}" / f"{i}.png")
        partial.rename(folder)
    return folder


def shards_of(folder: Path, store: str, size: int, channels: int) -> Path:
    shards = folder.with_name(f"{folder.name}_shards" + ("" if store == "files" else f"_{store}"))
    if not (shards / "litforge.json").is_file():
        split = ["--val-fraction", "0", "--test-fraction", "0", "--store", store]
        split += ["--image-size", str(size), "--channels", str(channels)]
        run(["optimize", str(folder), str(shards), *split], "litforge.streaming")
    return shards


def torchvision_batches(folder: Path, size: int, channels: int, workers: int, mean, std):
    from torchvision import datasets, transforms

    steps = [transforms.Grayscale()] if channels == 1 else []
    steps += [
        transforms.Resize(size),
        transforms.CenterCrop(size),
        transforms.ToTensor(),
        transforms.Normalize(mean, std),
    ]
    dataset = datasets.ImageFolder(folder / "train", transform=transforms.Compose(steps))
    loader = torch.utils.data.DataLoader(
        dataset, BATCH, shuffle=True, num_workers=workers, persistent_workers=workers > 0
    )
    return loader, lambda batch: batch


def datamodule_batches(datamodule):
    datamodule.inspect()  # not setup("fit"): these folders have no validation images
    loader = datamodule.train_dataloader()

    def finish(batch):  # what Lightning calls on a batch: before and after its transfer
        return datamodule.on_after_batch_transfer(datamodule.on_before_batch_transfer(batch, 0), 0)

    return loader, finish


def images_per_second(loader, finish, passes: int) -> float:
    rates = []
    for _ in range(passes + 1):  # the first warms up
        start, count = time.perf_counter(), 0
        for batch in loader:
            images, _ = finish(batch)
            count += len(images)
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates[1:])


def mix_costs(repeats: int = 50) -> None:
    from torchvision.transforms import v2

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

    def median_ms(step, *args) -> float:
        times = []
        for _ in range(repeats + 5):  # 5 to warm up
            sync()
            start = time.perf_counter()
            step(*args)
            sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times[5:]) * 1000

    images, labels = torch.rand(64, 3, 160, 160), torch.randint(0, 10, (64,))
    print(f"# {torch.get_num_threads()} CPU threads, {device}: ms per batch, median of {repeats}")
    print(f"| blend | in a worker (1 CPU thread) | per batch on {device.type} |")
    print("|---|---|---|")
    threads = torch.get_num_threads()
    for name, mix in (("MixUp", v2.MixUp(num_classes=10)), ("CutMix", v2.CutMix(num_classes=10))):
        torch.set_num_threads(1)  # what DataLoader gives each worker
        in_worker = median_ms(mix, images, labels)
        torch.set_num_threads(threads)
        x, y = images.to(device), labels.to(device)
        print(f"| {name} | {in_worker:.2f} | {median_ms(mix, x, y):.2f} |")
    if device.type == "cuda":
        for batch in (images.mul(255).byte(), images):
            copy = median_ms(batch.pin_memory().to, device)
            print(f"# copy to the device, {batch.dtype}: {copy:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--jpegs", type=int, default=2000, help="224×224 JPEGs to write")
    parser.add_argument("--passes", type=int, default=2, help="timed passes after the warm-up")
    parser.add_argument("--data-dir", type=Path, default=Path("data/benchmarks"))
    parser.add_argument("--mix", action="store_true", help="only time data.mix's blends")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    if args.mix:
        return mix_costs()

    from litforge.data.image_folder import ImageFolderDataModule

    try:
        from litforge.streaming.datamodule import StreamingDataModule
    except ImportError as error:  # the streaming feature left out, or litdata not installed
        StreamingDataModule, no_streaming = None, error

    args.data_dir.mkdir(parents=True, exist_ok=True)
    workloads = [
        ("Fashion-MNIST PNGs, 1×28×28", fashion_mnist_folder(args.data_dir), 28, 1),
        (
            f"{args.jpegs} JPEGs, 3×224×224",
            write_jpegs(args.data_dir / f"jpeg224_{args.jpegs}", args.jpegs),
            224,
            3,
        ),
    ]
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}; batches of {BATCH}, median of {args.passes} passes"
    )
    print(
        "| workload | workers | (a) torchvision ImageFolder | (b) data=image_folder | "
        "(c) data=streaming | (d) streaming pixels | b / a | c / b | d / b |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    if StreamingDataModule is None:
        print(f"# (c), (d) skipped: no streaming here ({no_streaming})", flush=True)
    for name, folder, size, channels in workloads:
        if StreamingDataModule is not None:
            shards = shards_of(folder, "files", size, channels)
            pixels = shards_of(folder, "pixels", size, channels)
        for workers in args.workers:
            settings = {"batch_size": BATCH, "num_workers": workers}
            image_folder = ImageFolderDataModule(
                root=str(folder), val_fraction=0, test_fraction=0, image_size=size,
                channels=channels, **settings
            )  # fmt: skip
            image_folder.inspect()
            rate_b = images_per_second(*datamodule_batches(image_folder), args.passes)
            rate_c = rate_d = None
            if StreamingDataModule is not None:
                streaming = StreamingDataModule(input_dir=str(shards), **settings)
                streaming_pixels = StreamingDataModule(input_dir=str(pixels), **settings)
                rate_c = images_per_second(*datamodule_batches(streaming), args.passes)
                rate_d = images_per_second(*datamodule_batches(streaming_pixels), args.passes)
            rate_a = images_per_second(
                *torchvision_batches(
                    folder,
                    size,
                    image_folder.channels,
                    workers,
                    image_folder.mean,
                    image_folder.std,
                ),
                args.passes,
            )
            c, d = (f"{r:,.0f}/s" if r else "skipped" for r in (rate_c, rate_d))
            c_b, d_b = (f"{r / rate_b:.2f}" if r else "–" for r in (rate_c, rate_d))
            print(
                f"| {name} | {workers} | {rate_a:,.0f}/s | {rate_b:,.0f}/s | {c} | {d} "
                f"| {rate_b / rate_a:.2f} | {c_b} | {d_b} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
