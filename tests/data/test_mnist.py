"""`data=mnist`: the datamodule on MNIST-format files the test writes."""

import torch
from helpers import write_idx_dataset

from litforge.data.mnist import MNISTDataModule


def make(tmp_path, **kwargs):
    return MNISTDataModule(data_dir=str(tmp_path), system_dir=None, download=False, **kwargs)


def test_splits_shapes_and_normalization(tmp_path):
    write_idx_dataset(tmp_path / "mnist", n_train=300, n_test=50, gz=True)
    dm = make(tmp_path, batch_size=64, val_size=60)
    dm.prepare_data()
    dm.setup()
    assert (len(dm.data_train), len(dm.data_val), len(dm.data_test)) == (240, 60, 50)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (64, 1, 28, 28) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and int(y.min()) >= 0 and int(y.max()) <= 9
    assert dm.input_shape == (1, 28, 28) and dm.num_classes == 10
    # normalized with MNIST's mean/std: a 0 pixel becomes -mean/std
    assert torch.isclose(x.min(), torch.tensor(-0.1307 / 0.3081), atol=1e-4)


def test_validation_split_is_seeded_and_disjoint(tmp_path):
    write_idx_dataset(tmp_path / "mnist", n_train=200, n_test=20)

    def split(seed):
        dm = make(tmp_path, val_size=50, split_seed=seed)
        dm.setup("fit")
        return dm.data_val.tensors[0], dm.data_train.tensors[0]

    val_a, train_a = split(0)
    val_b, _ = split(0)
    val_c, _ = split(1)
    assert torch.equal(val_a, val_b)
    assert not torch.equal(val_a, val_c)
    # no validation image is also a training image (the synthetic images are all distinct)
    train_rows = {tuple(row.flatten()[:200].tolist()) for row in train_a}
    assert not any(tuple(row.flatten()[:200].tolist()) in train_rows for row in val_a)
