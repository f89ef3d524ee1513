"""litforge.callbacks: the NaN stop (in-process fits of a small MLP on random tensors); the progress
bar: tests/test_console.py."""

import logging
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from litforge.callbacks import StopOnNonFiniteLoss
from litforge.errors import UserError
from litforge.models import ClassificationModule

NET = {"_target_": "litforge.models.mlp.MLP", "hidden_sizes": [16], "batch_norm": False}
SGD = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.01}


class NaNAt(ClassificationModule):
    """Its loss is NaN at one step."""

    def __init__(self, step: int) -> None:
        super().__init__(NET, [1, 4, 4], 3, SGD)
        self.nan_step = step

    def loss(self, logits, y):
        loss = super().loss(logits, y)
        return loss * float("nan") if self.global_step == self.nan_step else loss


def fit(module, *callbacks: L.Callback, **trainer) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 4, 4), torch.randint(0, 3, (64,))
    fitted = L.Trainer(
        max_epochs=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=bool(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StopOnNonFiniteLoss(), *callbacks],
        **trainer,
    )
    fitted.fit(module, DataLoader(TensorDataset(x, y), batch_size=8))


@pytest.mark.parametrize("log_every_n_steps", [1, 50])
def test_a_nan_loss_stops_the_run_naming_its_step(log_every_n_steps):
    # Checked when Lightning logs, and at the epoch's end at the latest (8 steps an epoch).
    with pytest.raises(UserError, match=r"became NaN or infinite at step 3 \(epoch 0\)"):
        fit(NaNAt(3), log_every_n_steps=log_every_n_steps)


def test_no_checkpoint_is_written_after_a_nan_loss(tmp_path):
    # A checkpoint every 2 steps, the NaN loss at step 11: step 12's is refused, 10's stays.
    saver = L.pytorch.callbacks.ModelCheckpoint(tmp_path, every_n_train_steps=2)
    with pytest.raises(UserError, match="at step 11"):
        fit(NaNAt(11), saver, log_every_n_steps=50)
    [kept] = tmp_path.glob("*.ckpt")
    assert kept.name == "epoch=1-step=10.ckpt"
    weights = torch.load(kept, weights_only=True)["state_dict"]
    assert all(torch.isfinite(w).all() for k, w in weights.items() if k.startswith("net."))


class Recorded:
    def __init__(self) -> None:
        self.logged = []

    def log_hyperparams(self, params) -> None:
        self.logged.append(params)


@pytest.mark.parametrize(
    ("config", "datamodule", "expected"),
    [
        ({"data": {"batch_size": 32}}, None, {"per_device": 32, "global": 128}),
        ({"data": {"_target_": "mine.Photos"}}, L.LightningDataModule(), None),  # unknown
    ],
)
def test_the_run_config_has_the_batch_size_of_the_config_or_none(
    config, datamodule, expected, caplog
):
    """Without `data.batch_size` (a datamodule of one's own) no batch size is said or logged."""
    from litforge.callbacks import LogRunConfig

    caplog.set_level(logging.INFO)
    logger = Recorded()
    trainer = SimpleNamespace(
        datamodule=datamodule,
        distributed_sampler_kwargs={"num_replicas": 2},
        accumulate_grad_batches=2,
        is_global_zero=True,
        loggers=[logger],
    )
    LogRunConfig(config).setup(trainer, None, "fit")
    assert logger.logged[0].get("batch_size") == expected
    assert ("Batch size:" in caplog.text) == (expected is not None)


def test_under_accumulation_the_nan_stop_names_the_optimizer_step_and_checks_once_a_step():
    checks = []

    class Counted(StopOnNonFiniteLoss):
        def check(self, trainer, agree=False):
            checks.append(trainer.global_step)
            super().check(trainer, agree)

    # 8 batches an epoch, 4 accumulated: 2 optimizer steps an epoch; step 3 is NaN.
    with pytest.raises(UserError, match=r"became NaN or infinite at step 3 \(epoch 1\)"):
        fit(NaNAt(3), Counted(), accumulate_grad_batches=4, log_every_n_steps=1)
    # Once an optimizer step (4 by the NaN), plus epoch 0's end and its checkpoint: not once a
    # batch (16 by the NaN).
    assert len(checks) <= 4 + 2, checks
