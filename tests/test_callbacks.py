"""litforge.callbacks.EpochStatistics: the training statistics a run logs, whatever the
Trainer's settings; in-process fits of a small MLP whose weights do not move (lr 1e-12), so
that each batch's loss is known beforehand."""

import csv
import logging

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from litforge.callbacks import EpochStatistics
from litforge.models import ClassificationModule

NET = {"_target_": "litforge.models.mlp.MLP", "hidden_sizes": [16], "batch_norm": False}
FROZEN = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 1e-12}  # weights stay put


def frozen_fit(tmp_path, batch_size: int, **trainer):
    """(module, trainer, per-batch losses the epoch saw) for one epoch over 64 samples."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 4, 4), torch.randint(0, 3, (64,))
    module = ClassificationModule(NET, [1, 4, 4], 3, FROZEN)
    with torch.no_grad():
        losses = [
            float(F.cross_entropy(module(x[i : i + batch_size]), y[i : i + batch_size]))
            for i in range(0, 64, batch_size)
        ]
    fitted = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=CSVLogger(tmp_path, name="", version=""),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer,
    )
    fitted.fit(module, DataLoader(TensorDataset(x, y), batch_size=batch_size))
    return module, fitted, losses


@pytest.mark.parametrize("accumulate", [1, 2])
def test_train_loss_is_the_epochs_mean_loss_with_and_without_accumulation(tmp_path, accumulate):
    # No callback given: the module brings its own (configure_callbacks).
    _, trainer, losses = frozen_fit(tmp_path, 8, accumulate_grad_batches=accumulate)
    assert float(trainer.callback_metrics["train/loss"]) == pytest.approx(sum(losses) / 8)
    assert 0 <= float(trainer.callback_metrics["train/acc"]) <= 1


def test_step_values_are_logged_at_the_step_of_their_batch(tmp_path):
    _, _, losses = frozen_fit(tmp_path, 8, log_every_n_steps=2)
    with (tmp_path / "metrics.csv").open() as f:
        rows = [row for row in csv.DictReader(f) if row.get("train/loss_step")]
    assert [int(row["step"]) for row in rows] == [1, 3, 5, 7]
    for row in rows:
        assert float(row["train/loss_step"]) == pytest.approx(losses[int(row["step"])], rel=1e-5)


def test_the_module_brings_its_statistics_once(tmp_path):
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    lightning_log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    lightning_log.addHandler(handler)
    try:
        module, trainer, _ = frozen_fit(tmp_path, 8)
        x, y = torch.randn(16, 1, 4, 4), torch.randint(0, 3, (16,))
        trainer.test(module, DataLoader(TensorDataset(x, y), batch_size=8))
    finally:
        lightning_log.removeHandler(handler)
    assert sum(isinstance(c, EpochStatistics) for c in trainer.callbacks) == 1
    assert said and not any("will override existing callbacks" in line for line in said)
