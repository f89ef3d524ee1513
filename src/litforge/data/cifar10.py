"""CIFAR-10: 50k/10k color photos in 10 classes, 3×32×32 (torchvision's `CIFAR10`, which checks
each file's MD5 sum before unpickling it)."""

from torchvision.datasets import CIFAR10

from litforge.data.base import InMemoryImageDataModule


class CIFAR10DataModule(InMemoryImageDataModule):
    dataset = CIFAR10
    name = "cifar10"
    folder = CIFAR10.base_folder  # cifar-10-batches-py
    input_shape = (3, 32, 32)
    num_train_images = 50000
    class_names = (
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    )
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)
