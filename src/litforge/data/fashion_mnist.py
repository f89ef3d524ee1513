"""Fashion-MNIST: Zalando's clothing images, MNIST's drop-in replacement (torchvision's
`FashionMNIST`). Offline, from Debian's package (`apt-get install dataset-fashion-mnist`): its
`.gz` files hold the same bytes as torchvision's downloads (compressed again, so their MD5 sums
differ), unpacked into `<root>/FashionMNIST/raw/`, where torchvision reads them."""

import gzip
import os
import shutil
from pathlib import Path

from torchvision.datasets import FashionMNIST

from litforge.data.base import InMemoryImageDataModule

DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"  # apt-get install dataset-fashion-mnist


class FashionMNISTDataModule(InMemoryImageDataModule):
    dataset = FashionMNIST
    name = "fashion_mnist"
    folder = "FashionMNIST/raw"
    input_shape = (1, 28, 28)
    num_train_images = 60000
    class_names = tuple(FashionMNIST.classes)  # T-shirt/top, Trouser, ..., Ankle boot
    mean = (0.2860,)
    std = (0.3530,)
    debian_package = "dataset-fashion-mnist"

    def __init__(self, *args, system_dir: str | None = DEBIAN_DIR, **kwargs) -> None:
        """`system_dir`: where Debian's package puts its files, or None."""
        super().__init__(*args, **kwargs)
        self.save_hyperparameters({"system_dir": system_dir})

    def place_files(self) -> None:
        """The files `root` lacks, unpacked from Debian's copy where it has them (whole: each
        written beside its place and renamed)."""
        if self.hparams.system_dir is None:
            return
        system, raw = Path(self.hparams.system_dir).expanduser(), self.root / self.folder
        for archive, _ in FashionMNIST.resources:
            packed, target = system / archive, raw / archive.removesuffix(".gz")
            if target.exists() or not packed.is_file():
                continue
            raw.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.{os.getpid()}.partial")  # (each its own)
            with gzip.open(packed) as source, partial.open("wb") as unpacked:
                shutil.copyfileobj(source, unpacked)
            partial.replace(target)
