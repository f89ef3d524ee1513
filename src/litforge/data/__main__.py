"""Datasets from the command line.

    python -m litforge.data fetch mnist [--data-dir data]  # before training, e.g. on a login node
    python -m litforge.data fetch fashion_mnist --apt      # offline: Debian's package
    python -m litforge.data export-images fashion_mnist DIR  # as DIR/<split>/<class>/<n>.png

A dataset name is the module name in `litforge.data` (and the config name in `conf/data/`).
"""

import argparse
import importlib
import inspect
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from litforge.data.base import InMemoryImageDataModule
from litforge.data.sources import DatasetNotFoundError, DatasetSource, locate
from litforge.errors import UserError


def builtin_datamodule(name: str) -> type[InMemoryImageDataModule]:
    try:
        module = importlib.import_module(f"litforge.data.{name}")
    except ModuleNotFoundError:
        raise UserError(f"unknown dataset '{name}': no module litforge.data.{name}.") from None
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if issubclass(obj, InMemoryImageDataModule) and obj.__module__ == module.__name__:
            return obj
    raise UserError(f"litforge.data.{name} has no built-in dataset (mnist, fashion_mnist, ...).")


def install_debian_package(source: DatasetSource) -> bool:
    """Install the dataset's Debian package if we are root and have apt-get; say what happens."""
    package = source.debian_package
    if not package or not shutil.which("apt-get"):
        return False
    if os.geteuid() != 0:
        print(
            f"No source had {source.name}. Install Debian's copy with:\n"
            f"  sudo apt-get install -y {package}"
        )
        return False
    print(f"No source had {source.name}: installing Debian's package {package} (apt-get).")
    command = ["apt-get", "install", "-y", "-q", package]
    if subprocess.run(command).returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update", "-q"], check=False)
        return subprocess.run(command).returncode == 0
    return True


def fetch(name: str, data_dir: str, system_dir: str, apt: bool) -> str:
    source = builtin_datamodule(name).source
    try:
        return str(locate(source, data_dir, system_dir))
    except DatasetNotFoundError:
        if apt and install_debian_package(source):
            return str(locate(source, data_dir, system_dir, allow_download=False))
        raise


def export_images(name: str, target: str, data_dir: str, system_dir: str, limit: int | None) -> str:
    """Write `target/<split>/<class>/<n>.png` via `target.partial`: no half-written folder."""
    import numpy as np
    from PIL import Image

    dest = Path(target).expanduser()
    if dest.exists() and any(dest.iterdir()):
        raise UserError(f"{dest} exists and is not empty: remove it or choose another folder.")
    module = builtin_datamodule(name)
    files = locate(module.source, data_dir, system_dir, allow_download=True)
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    # Class names as folder names: a path separator would make subfolders.
    folders = [c.replace("/", "_").replace("\\", "_") for c in module.class_names]
    datamodule = module(data_dir=str(files))
    for split in ("train", "test"):
        images, labels = datamodule.load_split(files, train=split == "train")
        count = len(labels) if limit is None else min(limit, len(labels))
        (partial / split).mkdir(parents=True)
        for label in labels[:count].unique().tolist():  # no folder for a class left out by limit
            (partial / split / folders[label]).mkdir()
        for i in range(count):
            pixels = images[i].permute(1, 2, 0).squeeze(2).numpy()  # H×W or H×W×3
            image = Image.fromarray(np.ascontiguousarray(pixels))
            image.save(partial / split / folders[int(labels[i])] / f"{i:05d}.png")
        print(f"{split}: {count} images")
    if dest.exists():
        dest.rmdir()
    partial.rename(dest)
    return str(dest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m litforge.data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("name", help="dataset, e.g. mnist or fashion_mnist")
    common.add_argument("--data-dir", default="data", help="default: ./data")
    common.add_argument("--system-dir", default="/usr/share/datasets")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_parser = commands.add_parser("fetch", parents=[common], help="find or download a dataset")
    fetch_parser.add_argument(
        "--apt", action="store_true", help="if nothing else works, install the Debian package"
    )
    export_parser = commands.add_parser(
        "export-images",
        parents=[common],
        help="write a built-in dataset as an image folder (PNG files)",
    )
    export_parser.add_argument("target", help="folder to create: target/<split>/<class>/<n>.png")
    export_parser.add_argument("--limit", type=int, help="at most this many images per split")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    try:
        if args.command == "fetch":
            directory = fetch(args.name, args.data_dir, args.system_dir, args.apt)
            print(f"{args.name}: files in {directory}")
        else:
            target = export_images(
                args.name, args.target, args.data_dir, args.system_dir, args.limit
            )
            print(f"{args.name}: images in {target}")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
