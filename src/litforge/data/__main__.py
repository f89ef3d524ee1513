"""Fetch a dataset ahead of training, e.g. on a login node for compute nodes without internet.

    python -m litforge.data fetch mnist [--data-dir data]
    python -m litforge.data fetch fashion_mnist --apt   # offline: fall back to Debian's package

The dataset name is the module name in `litforge.data` (and the config name in `conf/data/`).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import os
import shutil
import subprocess
import sys

from litforge.data.base import InMemoryImageDataModule
from litforge.data.sources import DatasetNotFoundError, DatasetSource, locate
from litforge.errors import UserError


def dataset_source(name: str) -> DatasetSource:
    """The `DatasetSource` of the datamodule defined in `litforge.data.<name>`."""
    try:
        module = importlib.import_module(f"litforge.data.{name}")
    except ModuleNotFoundError:
        raise UserError(f"unknown dataset '{name}': no module litforge.data.{name}.") from None
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if issubclass(obj, InMemoryImageDataModule) and obj.__module__ == module.__name__:
            return obj.source
    raise UserError(f"litforge.data.{name} defines no datamodule.")


def install_debian_package(source: DatasetSource) -> bool:
    """Install the dataset's Debian package if we are root and have apt-get; say what happens."""
    package = source.debian_package
    if not package or shutil.which("apt-get") is None:
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
    source = dataset_source(name)
    try:
        return str(locate(source, data_dir, system_dir))
    except DatasetNotFoundError:
        if apt and install_debian_package(source):
            return str(locate(source, data_dir, system_dir, allow_download=False))
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m litforge.data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_parser = commands.add_parser("fetch", help="find or download a dataset")
    fetch_parser.add_argument("name", help="dataset, e.g. mnist or fashion_mnist")
    fetch_parser.add_argument("--data-dir", default="data", help="default: ./data")
    fetch_parser.add_argument("--system-dir", default="/usr/share/datasets")
    fetch_parser.add_argument(
        "--apt", action="store_true", help="if nothing else works, install the Debian package"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    try:
        directory = fetch(args.name, args.data_dir, args.system_dir, args.apt)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{args.name}: files in {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
