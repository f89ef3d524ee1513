"""MNIST: handwritten digits, 60k train / 10k test, 1×28×28 (torchvision's `MNIST`)."""

from torchvision.datasets import MNIST

from litforge.data.base import InMemoryImageDataModule


class MNISTDataModule(InMemoryImageDataModule):
    dataset = MNIST
    name = "mnist"
    folder = "MNIST/raw"
    input_shape = (1, 28, 28)
    num_train_images = 60000
    class_names = tuple(str(digit) for digit in range(10))
    mean = (0.1307,)
    std = (0.3081,)
