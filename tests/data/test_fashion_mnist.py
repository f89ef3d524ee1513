"""`data=fashion_mnist` on the real dataset from Debian's dataset-fashion-mnist package."""

import pytest
from helpers import FASHION_MNIST_SYSTEM_DIR, compose_config

from litforge.data.fashion_mnist import FashionMNISTDataModule
from litforge.pipeline import train

needs_fashion_mnist = pytest.mark.skipif(
    not FASHION_MNIST_SYSTEM_DIR.is_dir(),
    reason=f"{FASHION_MNIST_SYSTEM_DIR} missing: apt-get install -y dataset-fashion-mnist",
)


@needs_fashion_mnist
def test_real_files_load_with_official_sizes(tmp_path):
    dm = FashionMNISTDataModule(data_dir=str(tmp_path), download=False)
    dm.setup()
    assert (len(dm.data_train), len(dm.data_val), len(dm.data_test)) == (55000, 5000, 10000)
    assert dm.data_test.tensors[1].bincount().tolist() == [1000] * 10
    # The configured mean/std really are the training set's
    train_images = dm.data_train.tensors[0]
    assert abs(float(train_images.mean())) < 0.01 and abs(float(train_images.std()) - 1) < 0.01
    assert dm.class_names[9] == "Ankle boot"


@needs_fashion_mnist
@pytest.mark.slow
def test_mlp_reaches_85_percent_on_the_real_test_set(tmp_path):
    # Real data from the system dir; the data dir is empty so nothing else can be used.
    cfg = compose_config("train", tmp_path, ["trainer.max_epochs=2", "data.download=false"])
    metrics = train(cfg)
    assert metrics["test/acc"] >= 0.85
