"""`data=mnist`: torchvision's MNIST, in memory, on MNIST-format files the test writes where
torchvision reads them (`<root>/MNIST/raw/`)."""

import re

import pytest
import torch
from helpers import compose_config, write_idx_dataset

from litforge.checks import check_config
from litforge.data.base import model_arguments
from litforge.data.mnist import MNISTDataModule
from litforge.errors import UserError


def make(tmp_path, **kwargs):
    return MNISTDataModule(root=str(tmp_path), download=False, **kwargs)


def test_splits_shapes_and_normalization(tmp_path):
    write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=300, n_test=50)
    dm = make(tmp_path, batch_size=64, val_size=60)
    dm.prepare_data()
    dm.setup()
    assert [len(dm.splits[s][1]) for s in ("train", "val", "test")] == [240, 60, 50]
    batch = next(iter(dm.train_dataloader()))
    assert batch[0].dtype == torch.uint8  # normalized on the training device:
    x, y = dm.on_after_batch_transfer(batch, 0)
    assert x.shape == (64, 1, 28, 28) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and int(y.min()) >= 0 and int(y.max()) <= 9
    assert model_arguments(dm)["input_shape"] == (1, 28, 28)
    assert model_arguments(dm)["num_classes"] == 10
    # normalized with MNIST's mean/std: a 0 pixel becomes -mean/std
    assert torch.isclose(x.min(), torch.tensor(-0.1307 / 0.3081), atol=1e-4)
    assert len(dm.train_dataloader()) == 4 and len(dm.test_dataloader()) == 1


def test_validation_split_is_seeded_and_disjoint(tmp_path):
    write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=200, n_test=20)

    def split(seed):
        dm = make(tmp_path, val_size=50, split_seed=seed)
        dm.setup("fit")
        return dm.splits["val"][0], dm.splits["train"][0]

    val_a, train_a = split(0)
    val_b, _ = split(0)
    val_c, _ = split(1)
    assert torch.equal(val_a, val_b)
    assert not torch.equal(val_a, val_c)
    # no validation image is also a training image (the synthetic images are all distinct)
    train_rows = {tuple(row.flatten().tolist()) for row in train_a}
    assert not any(tuple(row.flatten().tolist()) in train_rows for row in val_a)


def test_the_epochs_are_ordered_by_the_configs_seed_not_the_environment(tmp_path, monkeypatch):
    # Lightning's seed_everything exports PL_GLOBAL_SEED; the data reads its seed from the config
    # (`data.seed: ${seed}`), which every process of a run composes alike.
    from litforge.pipeline import build_datamodule

    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=100, n_test=20)
    data = [f"data.root={tmp_path}", "data.download=false"]
    cfg = compose_config("train", tmp_path, ["data=mnist", *data, "data.val_size=20", "seed=3"])
    assert cfg.data.seed == 3
    datamodule = build_datamodule(cfg)
    datamodule.setup("fit")
    sampler = datamodule.train_dataloader().sampler
    sampler.set_epoch(1)
    assert sampler.seed == 3  # as PL_GLOBAL_SEED=3 gave: the same batches as before
    expected = torch.randperm(80, generator=torch.Generator().manual_seed(3 + 1))
    assert list(sampler) == expected.tolist()
    # No seed: 0, as an unseeded run had.
    assert make(tmp_path, seed=None).hparams.seed is None
    unseeded = compose_config(
        "train", tmp_path, ["data=mnist", *data, "data.val_size=20", "seed=null"]
    )
    datamodule = build_datamodule(unseeded)
    datamodule.setup("fit")
    assert datamodule.train_dataloader().sampler.seed == 0


def test_val_size_larger_than_the_files_is_a_clear_error(tmp_path):
    write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=100, n_test=20)
    with pytest.raises(Exception, match=r"val_size=100 leaves no training data"):
        make(tmp_path, val_size=100).setup()


def test_images_and_labels_of_different_counts_are_refused(tmp_path):
    write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=100, n_test=20)
    write_idx_dataset(tmp_path / "other", n_train=90, n_test=20)
    labels = "train-labels-idx1-ubyte"
    (tmp_path / "MNIST" / "raw" / labels).write_bytes((tmp_path / "other" / labels).read_bytes())
    with pytest.raises(UserError, match=r"raw holds 90 labels for 100 images of \(1, 28, 28\)"):
        make(tmp_path, val_size=10).setup()


def test_the_run_logs_which_folder_its_data_came_from(tmp_path, caplog):
    write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=100, n_test=20)
    with caplog.at_level("INFO"):
        make(tmp_path, val_size=10).setup()
    assert f"Data: mnist from {tmp_path / 'MNIST' / 'raw'}" in caplog.text


def test_k_folds_partition_the_training_split_stratified_and_leave_test_alone(tmp_path):
    write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=200, n_test=20)
    folds = []
    for fold in range(4):
        dm = make(tmp_path, num_folds=4, fold=fold)
        dm.setup()
        folds.append(dm.splits)
    rows = [{tuple(x.flatten().tolist()) for x in splits["val"][0]} for splits in folds]
    assert [len(r) for r in rows] == [50] * 4
    assert len(set.union(*rows)) == 200  # disjoint, and together the whole training split
    for val, splits in zip(rows, folds, strict=True):  # training: the other folds
        train = {tuple(x.flatten().tolist()) for x in splits["train"][0]}
        assert len(train) == 150 and not train & val
        assert torch.equal(splits["test"][0], folds[0]["test"][0])
    labels = torch.cat([splits["train"][1], splits["val"][1]])
    for splits in folds:  # each class's share in every fold (±1 image)
        per_class, whole = torch.bincount(splits["val"][1], minlength=10), torch.bincount(labels)
        assert ((per_class - whole / 4).abs() <= 1).all()


def test_a_fold_outside_num_folds_is_refused_saying_which_are(tmp_path):
    for folds, line in [
        (["num_folds=4", "fold=4"], "data.fold=4 is not a fold of data.num_folds=4: give 0 to 3"),
        (["num_folds=1"], "data.num_folds=1: must be >= 2."),
    ]:
        cfg = compose_config("train", tmp_path, ["data=mnist", *(f"data.{f}" for f in folds)])
        with pytest.raises(UserError, match=re.escape(line)):
            check_config(cfg)


def test_trainer_predict_gives_logits_for_every_test_image(tmp_path):
    import lightning as L
    from helpers import compose_config

    from litforge.pipeline import build_model

    write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=100, n_test=30)
    data = [f"data.root={tmp_path}", "data.download=false"]
    cfg = compose_config("train", tmp_path, ["data=mnist", *data, "data.batch_size=8"])
    dm = make(tmp_path, batch_size=8)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    logits = trainer.predict(build_model(cfg, dm), datamodule=dm)
    assert torch.cat(logits).shape == (30, 10)


def test_missing_files_are_one_line_naming_the_folder_and_the_fixes(tmp_path):
    with pytest.raises(UserError) as refused:
        make(tmp_path / "empty").setup()
    line = str(refused.value)
    assert "\n" not in line
    raw = tmp_path / "empty" / "MNIST" / "raw"
    assert f"mnist not found in {raw} (torchvision.datasets.MNIST: Dataset not found" in line
    assert "or set data.root=<a folder holding MNIST/raw/>" in line
    assert not (tmp_path / "empty").exists()  # nothing made


@pytest.mark.parametrize("damage", ["truncated", "no IDX file"])
def test_damaged_files_are_one_line_saying_what_to_do(tmp_path, damage):
    raw = write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=100, n_test=20)
    images = raw / "train-images-idx3-ubyte"
    data = images.read_bytes()
    images.write_bytes(data[:-100] if damage == "truncated" else b"<html>" + data[6:])
    with pytest.raises(UserError, match=r"raw holds files torchvision.datasets.MNIST cannot read"):
        make(tmp_path, val_size=10).setup()


def test_labels_outside_the_classes_are_refused(tmp_path):
    import numpy as np
    from helpers import write_idx

    raw = write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=100, n_test=20)
    write_idx(raw / "t10k-labels-idx1-ubyte", np.full(20, 12, dtype=np.uint8))
    with pytest.raises(UserError, match="holds labels outside 0-9: replace the files"):
        make(tmp_path).setup("test")


def test_a_failed_download_leaves_nothing_behind(tmp_path, monkeypatch):
    from helpers import go_offline

    go_offline(monkeypatch)
    dm = MNISTDataModule(root=str(tmp_path / "data"), download=True)
    with pytest.raises(UserError, match=r"mnist not found in .* \(its download failed: "):
        dm.prepare_data()
    assert not (tmp_path / "data").exists()
