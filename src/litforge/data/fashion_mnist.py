"""Fashion-MNIST: Zalando's clothing images, MNIST's drop-in replacement (same files, shapes).
Debian packages it (`apt-get install dataset-fashion-mnist`), so it also works offline."""

from litforge.data.idx import IDXDataModule
from litforge.data.sources import DatasetSource

# Mirror and checksums as torchvision publishes them (torchvision.datasets.FashionMNIST).
FASHION_MNIST = DatasetSource(
    name="fashion_mnist",
    files=(*IDXDataModule.split_files[True], *IDXDataModule.split_files[False]),
    mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    resources=(
        ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
        ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
        ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
        ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
    ),
    system_name="fashion-mnist",
    debian_package="dataset-fashion-mnist",
    aliases=("FashionMNIST/raw",),
)


class FashionMNISTDataModule(IDXDataModule):
    source = FASHION_MNIST
    class_names = (
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    )
    mean = (0.2860,)
    std = (0.3530,)
