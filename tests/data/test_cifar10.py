"""`data=cifar10`: torchvision's CIFAR10, in memory, on `cifar-10-batches-py` pickles the test
writes in their real layout (read by `helpers.WrittenCIFAR10`, whose checksum tables hold those
files' MD5 sums)."""

import os
import pickle
from types import SimpleNamespace

import pytest
import torch
from helpers import WrittenCIFAR10DataModule, compose_config, write_cifar10

from litforge.checks import check_config
from litforge.data.cifar10 import CIFAR10DataModule
from litforge.errors import UserError


def make(root, **kwargs):
    return WrittenCIFAR10DataModule(root=str(root), download=False, **kwargs)


def test_loads_splits_as_uint8_channels_first(tmp_path):
    folder = write_cifar10(tmp_path, per_batch=40, n_test=30)
    dm = make(tmp_path, val_size=50)
    dm.prepare_data()
    dm.setup()
    images, labels = dm.splits["train"]
    assert images.shape == (150, 3, 32, 32) and images.dtype == torch.uint8
    assert len(dm.splits["val"][1]) == 50 and len(dm.splits["test"][1]) == 30
    # channel 0 is red: the bright band the writer painted there is found in red only
    raw = pickle.loads((folder / "test_batch").read_bytes())
    first = torch.from_numpy(raw["data"][0].reshape(3, 32, 32))
    assert torch.equal(dm.splits["test"][0][0], first)
    assert dm.splits["test"][1][0] == raw["labels"][0]


def test_train_batches_are_augmented_and_normalized(tmp_path):
    write_cifar10(tmp_path)
    dm = make(tmp_path, val_size=40, batch_size=32, crop_padding=4, horizontal_flip=True)
    dm.setup()
    cpu = SimpleNamespace(root_device=torch.device("cpu"))
    dm.trainer = SimpleNamespace(
        training=True, current_epoch=0, global_rank=0, strategy=cpu,
        distributed_sampler_kwargs=None,
    )  # fmt: skip
    images, labels = next(iter(dm.train_dataloader()))
    assert images.dtype == torch.uint8  # until the training device
    x, y = dm.on_after_batch_transfer((images, labels), 0)
    assert x.shape == (32, 3, 32, 32) and x.dtype == torch.float32 and torch.equal(y, labels)
    mean, std = torch.tensor(dm.mean).view(1, 3, 1, 1), torch.tensor(dm.std).view(1, 3, 1, 1)
    assert not torch.allclose(x, (images.float() / 255 - mean) / std)  # cropped and flipped
    dm.trainer.training = False
    val_x, _ = dm.on_after_batch_transfer(next(iter(dm.val_dataloader())), 0)
    expected = (dm.splits["val"][0][:32].float() / 255 - mean) / std
    assert torch.allclose(val_x, expected, atol=1e-5)  # validation: not augmented


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing", r"cifar10 not found in .*cifar-10-batches-py \(torchvision.datasets"),
        ("wrong_keys", r"cifar-10-batches-py holds files torchvision.datasets.WrittenCIFAR10 "),
        ("label_count", r"holds 165 labels for 200 images"),
    ],
)
def test_malformed_batches_are_one_line(tmp_path, damage, message):
    folder = write_cifar10(tmp_path)
    path = folder / "data_batch_3"
    good = pickle.loads(path.read_bytes())
    if damage == "missing":
        path.unlink()
    elif damage == "wrong_keys":
        path.write_bytes(pickle.dumps({"pixels": good["data"]}, protocol=2))
    elif damage == "label_count":
        path.write_bytes(pickle.dumps({**good, "labels": good["labels"][:5]}, protocol=2))
    with pytest.raises(UserError, match=message):
        make(tmp_path, val_size=10).setup()


def test_files_other_than_the_originals_are_refused_before_they_are_unpickled(tmp_path):
    """torchvision checks each file's MD5 sum against the original's first: a pickle that
    would run code is never loaded."""
    folder = write_cifar10(tmp_path)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (folder / "data_batch_3").write_bytes(pickle.dumps({"data": Exploit()}, protocol=2))
    dm = CIFAR10DataModule(root=str(tmp_path), download=False, val_size=10)
    with pytest.raises(UserError, match="Dataset not found or corrupted"):
        dm.setup()
    assert not marker.exists()


def test_val_size_beyond_the_training_set_is_refused(tmp_path):
    cfg = compose_config("train", tmp_path, ["data=cifar10", "data.val_size=50000"])
    with pytest.raises(UserError, match="data.val_size=50000 must be below the 50000 .* cifar10"):
        check_config(cfg)


def test_cifar10_cnn_experiment_trains_on_synthetic_files(tmp_path):
    from helpers import compose_config

    from litforge.pipeline import train

    write_cifar10(tmp_path / "data", per_batch=40, n_test=40)
    cfg = compose_config(
        "train",
        tmp_path,
        [
            "experiment=cifar10_cnn",
            "data._target_=helpers.WrittenCIFAR10DataModule",
            "data.val_size=40",
            "data.batch_size=32",
            "trainer.max_epochs=1",
        ],
    )
    metrics = train(cfg)
    assert {"test/acc", "val/acc_best"} <= set(metrics)
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
