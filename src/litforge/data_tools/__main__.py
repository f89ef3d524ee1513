"""The built-in datasets from the command line.

    python -m litforge.data_tools fetch mnist [--root data]  # before training, e.g. on a login node
    python -m litforge.data_tools fetch fashion_mnist --apt  # offline: Debian's package
    python -m litforge.data_tools export-images fashion_mnist DIR  # DIR/<split>/<class>/<n>.png

A dataset name is the module name in `litforge.data` (and the config name in `conf/data/`);
`--root` is `data.root` (default: ./data, as `paths.data_dir` of a run in this folder).
"""

import argparse
import importlib
import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

from litforge.data.base import InMemoryImageDataModule
from litforge.errors import UserError


def builtin_datamodule(name: str, root: str) -> InMemoryImageDataModule:
    """The datamodule of `litforge.data.<name>`, reading `root`, downloading what is missing."""
    try:
        module = importlib.import_module(f"litforge.data.{name}")
    except ModuleNotFoundError:
        raise UserError(f"unknown dataset '{name}': no module litforge.data.{name}.") from None
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if issubclass(cls, InMemoryImageDataModule) and cls.__module__ == module.__name__:
            return cls(root=root, download=True)
    raise UserError(f"litforge.data.{name} has no built-in dataset (mnist, fashion_mnist, ...).")


def install_debian_package(package: str) -> bool:
    """Install `package` if we are root and have apt-get; say what happens."""
    if not shutil.which("apt-get"):
        return False
    if os.geteuid() != 0:
        print(f"Install Debian's copy with:\n  sudo apt-get install -y {package}")
        return False
    print(f"Installing Debian's package {package} (apt-get).")
    command = ["apt-get", "install", "-y", "-q", package]
    if subprocess.run(command).returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update", "-q"], check=False)
        return subprocess.run(command).returncode == 0
    return True


def fetch(name: str, root: str, apt: bool) -> Path:
    datamodule = builtin_datamodule(name, root)
    package = datamodule.debian_package
    if apt and package and not Path(datamodule.hparams.system_dir or "").is_dir():
        install_debian_package(package)
    datamodule.prepare_data()
    return datamodule.root / datamodule.folder


def export_images(name: str, target: str, root: str, limit: int | None) -> Path:
    """Write `target/<split>/<class>/<n>.png` via `target.partial`: no half-written folder."""
    import numpy as np
    from PIL import Image

    dest = Path(target).expanduser()
    if dest.exists() and any(dest.iterdir()):
        raise UserError(f"{dest} exists and is not empty: remove it or choose another folder.")
    datamodule = builtin_datamodule(name, root)
    datamodule.place_files()
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    # Class names as folder names: a path separator would make subfolders.
    folders = [c.replace("/", "_").replace("\\", "_") for c in datamodule.class_names]
    for split in ("train", "test"):
        images, labels = datamodule.read(train=split == "train", download=True)
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
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m litforge.data_tools",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("name", help="dataset, e.g. mnist or fashion_mnist")
    common.add_argument("--root", default="data", help="data.root: default ./data")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_parser = commands.add_parser("fetch", parents=[common], help="find or download a dataset")
    fetch_parser.add_argument(
        "--apt", action="store_true", help="first install the Debian package, if it has one"
    )
    export_parser = commands.add_parser(
        "export-images",
        parents=[common],
        help="write a built-in dataset as an image folder (PNG files)",
    )
    export_parser.add_argument("target", help="folder to create: target/<split>/<class>/<n>.png")
    export_parser.add_argument("--limit", type=int, help="at most this many images per split")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(f"{args.name}: files in {fetch(args.name, args.root, args.apt)}")
        else:
            target = export_images(args.name, args.target, args.root, args.limit)
            print(f"{args.name}: images in {target}")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
