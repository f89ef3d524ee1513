"""`data=cifar10`: the `cifar-10-batches-py` pickles, written by the test in their real layout."""

import os
import pickle
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import write_cifar10

from litforge.data.cifar10 import CIFAR10, CIFAR10DataModule, CIFARFormatError
from litforge.data.sources import locate
from litforge.errors import UserError


def make(data_dir, **kwargs):
    return CIFAR10DataModule(data_dir=str(data_dir), system_dir=None, download=False, **kwargs)


def test_loads_splits_as_uint8_channels_first(tmp_path):
    folder = write_cifar10(tmp_path / "cifar10", per_batch=40, n_test=30)
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


def test_torchvision_layout_is_found(tmp_path):
    write_cifar10(tmp_path)  # data_dir/cifar-10-batches-py, as torchvision extracts it
    assert locate(CIFAR10, tmp_path, None, allow_download=False) == tmp_path


def test_train_batches_are_augmented_and_normalized(tmp_path):
    write_cifar10(tmp_path / "cifar10")
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
    expected = (
        dm.splits["val"][0][:32].float() / 255 - torch.tensor(dm.mean).view(1, 3, 1, 1)
    ) / torch.tensor(dm.std).view(1, 3, 1, 1)
    assert torch.allclose(val_x, expected, atol=1e-5)  # validation: not augmented


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing", "data_batch_3 is missing"),
        ("truncated", "data_batch_3 is not a CIFAR-10 batch"),
        ("wrong_keys", "has no 'data' and 'labels'"),
        ("wrong_shape", "'data' must be uint8 of shape N×3072"),
        ("label_count", "labels for 40 images"),
        ("code", "refusing to load posix.system"),
    ],
)
def test_malformed_batches_are_named(tmp_path, damage, message):
    folder = write_cifar10(tmp_path / "cifar10")
    path = folder / "data_batch_3"
    good = pickle.loads(path.read_bytes())
    if damage == "missing":
        path.unlink()
        (folder / "data_batch_3.gz").write_bytes(b"")  # keeps the folder "complete" for lookup
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:500])
    elif damage == "wrong_keys":
        path.write_bytes(pickle.dumps({"pixels": good["data"]}, protocol=2))
    elif damage == "wrong_shape":
        path.write_bytes(pickle.dumps({**good, "data": good["data"][:, :100]}, protocol=2))
    elif damage == "label_count":
        path.write_bytes(pickle.dumps({**good, "labels": good["labels"][:5]}, protocol=2))
    elif damage == "code":

        class Exploit:
            def __reduce__(self):
                return (os.system, ("echo pwned",))

        path.write_bytes(pickle.dumps({"data": Exploit(), "labels": []}, protocol=2))
    with pytest.raises(CIFARFormatError, match=message):
        make(tmp_path, val_size=10).setup()


def test_val_size_beyond_the_training_set_is_refused():
    with pytest.raises(UserError, match="val_size=50000 must be below the 50000"):
        make("unused", val_size=50000)


def test_decoded_tensors_are_cached_and_reused(tmp_path):
    write_cifar10(tmp_path / "cifar10")
    dm = make(tmp_path, val_size=10)
    dm.prepare_data()
    cache = dm.cache_path(dm.locate())
    assert cache == tmp_path / "cifar10" / "decoded-uint8.pt"  # beside the files
    cached = torch.load(cache, weights_only=True)
    # The cache, not the pickles, is what the next setup reads: poison it and look.
    cached["splits"]["test"][0][0].fill_(7)
    torch.save(cached, cache)
    again = make(tmp_path, val_size=10)
    again.setup()
    assert int(again.splits["test"][0][0].float().mean()) == 7


def test_cache_from_another_format_is_rebuilt(tmp_path, caplog):
    write_cifar10(tmp_path / "cifar10")
    dm = make(tmp_path, val_size=10)
    dm.prepare_data()
    cache = dm.cache_path(dm.locate())
    torch.save({"format": 0, "splits": {}}, cache)
    again = make(tmp_path, val_size=10)
    with caplog.at_level("INFO"):
        again.prepare_data()
    again.setup()
    assert "another format or source" in caplog.text
    assert torch.load(cache, weights_only=True)["format"] == 1
    assert np.asarray(again.splits["test"][1]).size == 40


def test_cifar10_cnn_experiment_trains_on_synthetic_files(tmp_path):
    from helpers import compose_config

    from litforge.pipeline import train

    write_cifar10(tmp_path / "data" / "cifar10", per_batch=40, n_test=40)
    cfg = compose_config(
        "train",
        tmp_path,
        [
            "experiment=cifar10_cnn",
            "data.val_size=40",
            "data.batch_size=32",
            "trainer.max_epochs=1",
        ],
    )
    metrics = train(cfg)
    assert {"test/acc", "val/acc_best"} <= set(metrics)
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
