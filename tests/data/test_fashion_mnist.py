"""`data=fashion_mnist` on the real dataset: `make data` put it in ./data or Debian's package in
/usr/share/datasets (apt-get install dataset-fashion-mnist)."""

import pytest
from helpers import NO_FASHION_MNIST, ROOT, compose_config, fashion_mnist_dir

from litforge.data.fashion_mnist import FashionMNISTDataModule
from litforge.pipeline import train

DATA_DIR = ROOT / "data"
REAL_DIR = fashion_mnist_dir()
needs_fashion_mnist = pytest.mark.skipif(REAL_DIR is None, reason=NO_FASHION_MNIST)


@needs_fashion_mnist
def test_real_files_load_with_official_sizes(tmp_path):
    dm = FashionMNISTDataModule(root_dir=str(DATA_DIR), download=False)
    dm.setup()
    assert [len(dm.splits[s][1]) for s in ("train", "val", "test")] == [55000, 5000, 10000]
    assert dm.splits["test"][1].bincount().tolist() == [1000] * 10
    # The configured mean/std really are the training set's
    train_images = dm.splits["train"][0].float() / 255
    assert abs(float(train_images.mean()) - dm.mean[0]) < 0.005
    assert abs(float(train_images.std()) - dm.std[0]) < 0.005
    assert dm.class_names[9] == "Ankle boot"


@needs_fashion_mnist
@pytest.mark.slow
def test_mlp_reaches_85_percent_on_the_real_test_set(tmp_path):
    cfg = compose_config(
        "train",
        tmp_path,
        ["trainer.max_epochs=2", "data.download=false", f"paths.data_dir={DATA_DIR}"],
    )
    metrics = train(cfg)
    assert metrics["test/acc"] >= 0.85
