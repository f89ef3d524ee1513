"""`data=fashion_mnist`: torchvision's FashionMNIST, its files unpacked from Debian's package
(apt-get install dataset-fashion-mnist) where torchvision reads them; on the real dataset where
it is installed."""

import gzip

import pytest
from helpers import (
    NO_FASHION_MNIST,
    ROOT,
    compose_config,
    fashion_mnist_dir,
    go_offline,
    write_idx_dataset,
)

from litforge.data.fashion_mnist import FashionMNISTDataModule
from litforge.errors import UserError
from litforge.pipeline import train

DATA_DIR = ROOT / "data"
REAL_DIR = fashion_mnist_dir()
needs_fashion_mnist = pytest.mark.skipif(REAL_DIR is None, reason=NO_FASHION_MNIST)


@needs_fashion_mnist
def test_real_files_load_with_official_sizes(tmp_path):
    dm = FashionMNISTDataModule(root=str(DATA_DIR), download=False)
    dm.prepare_data()
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


def test_debians_copy_is_unpacked_where_torchvision_reads_it_with_nothing_downloaded(
    tmp_path, monkeypatch
):
    """Debian's package holds gzipped IDX files (compressed again: other MD5 sums than
    torchvision's downloads); unpacked into <root>/FashionMNIST/raw/, torchvision reads them."""
    go_offline(monkeypatch)
    debian = write_idx_dataset(tmp_path / "debian", n_train=100, n_test=20, gz=True)
    dm = FashionMNISTDataModule(root=str(tmp_path / "data"), system_dir=str(debian), val_size=10)
    dm.prepare_data()  # download=true: nothing is missing once unpacked
    dm.setup()
    raw = tmp_path / "data" / "FashionMNIST" / "raw"
    for packed in debian.glob("*.gz"):
        assert (raw / packed.stem).read_bytes() == gzip.decompress(packed.read_bytes())
    assert sorted(p.name for p in raw.iterdir()) == sorted(p.stem for p in debian.glob("*.gz"))
    assert [len(dm.splits[s][1]) for s in ("train", "val", "test")] == [90, 10, 20]


def test_without_the_files_the_line_names_debians_package(tmp_path):
    dm = FashionMNISTDataModule(root=str(tmp_path), system_dir=str(tmp_path / "no"), download=False)
    with pytest.raises(
        UserError, match=r"or install Debian's copy \(apt-get install -y dataset-fa"
    ):
        dm.prepare_data()
        dm.setup()
