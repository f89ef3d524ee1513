"""`callbacks.plots`: a run's pictures, and the epochs they are drawn from kept in checkpoints."""

import torch
from helpers import compose_config

from litforge.pipeline import train

FAST = ["data=mnist", "data.val_size=100", "data.batch_size=64", "logger=none"]


def test_a_run_draws_its_curves_and_confusion_matrix_without_a_logger(tmp_path, idx_data_dir):
    train(compose_config("train", tmp_path, [*FAST, "trainer.max_epochs=3"]))
    for name in ("confusion_matrix.png", "curves.png"):
        data = (tmp_path / "run" / "plots" / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, name
    history = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    # every epoch with train and val statistics, kept in checkpoints for resumed runs' curves
    [epochs] = [v["epochs"] for k, v in history["callbacks"].items() if "ClassificationPlots" in k]
    assert sorted(epochs) == [0, 1, 2]
    assert all(
        set(m) == {"train/loss", "train/acc", "val/loss", "val/acc"} for m in epochs.values()
    )
