"""MNIST: handwritten digits, 60k train / 10k test, 1×28×28."""

from litforge.data.idx import IDXDataModule
from litforge.data.sources import DatasetSource

# Mirrors and checksums as torchvision publishes them (torchvision.datasets.MNIST).
MNIST = DatasetSource(
    name="mnist",
    files=(*IDXDataModule.split_files[True], *IDXDataModule.split_files[False]),
    mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
    resources=(
        ("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
        ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
        ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
        ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
    ),
    aliases=("MNIST/raw",),  # where torchvision.datasets.MNIST(root=data_dir) puts them
)


class MNISTDataModule(IDXDataModule):
    source = MNIST
    class_names = tuple(str(digit) for digit in range(10))
    mean = (0.1307,)
    std = (0.3081,)
