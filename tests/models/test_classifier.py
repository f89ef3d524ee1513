"""`ClassificationModule`: checkpoints independent of how the network ran (eager or compiled);
the Trainer's optimization settings under its own optimizer steps."""

import importlib.util
import json
import os

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import compose_config, predicted_accuracy, run_script, write_idx_dataset
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, TensorDataset

from litforge.models import ClassificationModule
from litforge.pipeline import evaluate

NET = {"_target_": "litforge.models.cnn.CNN", "channels": [4], "hidden_size": 8}
OPTIMIZER = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1}


def make(compile: bool) -> ClassificationModule:
    torch.manual_seed(0)
    return ClassificationModule(NET, [1, 28, 28], 10, OPTIMIZER, compile=compile)


def test_compile_flag_is_not_part_of_the_checkpoint():
    model = make(compile=True)
    assert "compile" not in model.hparams and model.compile_net
    assert set(model.state_dict()) == set(make(compile=False).state_dict())


@pytest.mark.slow
def test_compiled_run_checkpoint_loads_into_eager_eval(tmp_path):
    data_dir = write_idx_dataset(
        tmp_path / "data" / "MNIST" / "raw", n_train=300, n_test=100
    ).parents[1]
    run_dir = tmp_path / "run"
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    result = run_script(
        "train.py",
        "model.compile=true",
        "model.net.hidden_sizes=[16]",
        "data=mnist",
        "data.val_size=50",
        f"paths.data_dir={data_dir}",
        "trainer.max_epochs=1",
        f"hydra.run.dir={run_dir}",
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.listdir(tmp_path / "inductor"), "inductor compiled nothing: compile was not used"
    best = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    state = torch.load(best, weights_only=True)["state_dict"]
    assert not [key for key in state if "_orig_mod" in key]

    overrides = [f"ckpt_path={best}", "data=mnist", f"paths.data_dir={data_dir}"]
    evaluated = evaluate(compose_config("eval", tmp_path / "eval", overrides))  # eval.py's path
    trained = json.loads((run_dir / "metrics.json").read_text())
    assert evaluated["test/acc"] == pytest.approx(trained["test/acc"], abs=1e-6)
    if importlib.util.find_spec("litforge.deploy"):  # predict.py, export.py, serve.py: eagerly too
        predicted = predicted_accuracy(best, data_dir)
        assert predicted == pytest.approx(trained["test/acc"], abs=1e-6)


# Lightning steps the module's optimizer (automatic optimization): what the Trainer's settings
# ask for holds: accumulation, clipping, mixed precision, schedulers. Small in-process fits.
MLP = {"_target_": "litforge.models.mlp.MLP", "hidden_sizes": [16], "batch_norm": False}


def fit(batch_size: int, optimizer=OPTIMIZER, scheduler=None, callbacks=(), epochs=1, **trainer):
    """A 64-sample MLP fit, batches in a fixed order; the trained module and trainer."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 4, 4), torch.randint(0, 3, (64,))
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    model = ClassificationModule(MLP, [1, 4, 4], 3, optimizer, scheduler)
    fitted = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **trainer,
    )
    fitted.fit(model, loader, loader)
    return model, fitted


def test_accumulated_batches_step_as_one_batch_that_many_times_larger():
    accumulated, trainer = fit(batch_size=8, accumulate_grad_batches=4)
    whole, _ = fit(batch_size=32)
    assert trainer.global_step == 2
    for a, b in zip(accumulated.parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    # The last batches of an epoch step too, fewer than accumulate_grad_batches as they are.
    assert fit(batch_size=8, accumulate_grad_batches=3)[1].global_step == 3


class GradientsAfterStep(L.Callback):
    """The gradients each optimizer step applied (still there at the end of the batch)."""

    def __init__(self) -> None:
        self.norms, self.largest = [], []

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        grads = [p.grad for p in pl_module.parameters()]
        self.norms.append(float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))))
        self.largest.append(max(float(g.abs().max()) for g in grads))


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradients_are_clipped(algorithm):
    unclipped, clipped = GradientsAfterStep(), GradientsAfterStep()
    fit(batch_size=16, callbacks=[unclipped])
    fit(
        batch_size=16,
        callbacks=[clipped],
        gradient_clip_val=1e-3,
        gradient_clip_algorithm=algorithm,
    )
    measured = {"norm": clipped.norms, "value": clipped.largest}[algorithm]
    assert min(unclipped.largest) > 1e-2, "nothing to clip: the test shows nothing"
    assert max(measured) <= 1e-3 * (1 + 1e-5)


def test_a_module_fits_again_with_clipping_and_accumulation():
    # A second fit (fine-tuning, a notebook) with the settings of the first.
    model, _ = fit(batch_size=16, gradient_clip_val=1e-3, accumulate_grad_batches=2)
    loader = DataLoader(TensorDataset(torch.randn(32, 1, 4, 4), torch.randint(0, 3, (32,))), 16)
    again = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=1e-3,
        accumulate_grad_batches=2,
    )
    again.fit(model, loader)
    assert again.global_step == 1


def test_bf16_mixed_precision_runs_the_network_in_bfloat16():
    dtypes = set()

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, *args) -> None:
            pl_module.net.register_forward_hook(lambda m, i, out: dtypes.add(out.dtype))

    model, trainer = fit(batch_size=16, precision="bf16-mixed", callbacks=[Record()])
    assert dtypes == {torch.bfloat16}
    assert trainer.global_step == 4 and torch.isfinite(trainer.callback_metrics["train/loss"])


def lr(trainer: L.Trainer) -> float:
    return trainer.optimizers[0].param_groups[0]["lr"]


@pytest.mark.parametrize(
    ("interval", "frequency", "steps"),
    # 3 epochs of 4 batches; a step frequency counts the batches of an epoch, as in Lightning
    [("epoch", 1, 3), ("step", 1, 12), ("step", 3, 3)],
)
def test_schedulers_step_at_their_interval(interval, frequency, steps):
    step_lr = {"_target_": "torch.optim.lr_scheduler.StepLR", "_partial_": True}
    scheduler = {**step_lr, "step_size": 1, "gamma": 0.5, "interval": interval}
    _, trainer = fit(batch_size=16, scheduler={**scheduler, "frequency": frequency}, epochs=3)
    assert lr(trainer) == pytest.approx(0.1 * 0.5**steps)


def test_reduce_on_plateau_steps_on_its_monitored_metric():
    scheduler = {
        "_target_": "torch.optim.lr_scheduler.ReduceLROnPlateau",
        "_partial_": True,
        "monitor": "val/loss",
        "patience": 0,
        "factor": 0.5,
        # Never an improvement by this much: each epoch after the first reduces the rate.
        "threshold": 100.0,
        "threshold_mode": "abs",
    }
    _, trainer = fit(batch_size=16, scheduler=scheduler, epochs=3)
    assert lr(trainer) == pytest.approx(0.1 * 0.5**2)
    missing = {**scheduler, "monitor": "val/nothing"}
    with pytest.raises(MisconfigurationException, match="conditioned on metric val/nothing"):
        fit(batch_size=16, scheduler=missing, epochs=1)
    # Without a monitor: Lightning's error; a config without one is refused before (test_errors)
    unset = {k: v for k, v in scheduler.items() if k != "monitor"}
    with pytest.raises(MisconfigurationException, match="must include a monitor"):
        fit(batch_size=16, scheduler=unset, epochs=1)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_train_loss_is_the_epochs_mean_and_each_logged_step_its_own(tmp_path, accumulate):
    """`train/loss` (the epoch's mean over samples), `train/loss_step` at the steps loggers
    write, with and without accumulation: weights that do not move (lr 1e-12) make each batch's
    loss known beforehand."""
    import csv

    from lightning.pytorch.loggers import CSVLogger

    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 4, 4), torch.randint(0, 3, (64,))
    net = {"_target_": "litforge.models.mlp.MLP", "hidden_sizes": [16], "batch_norm": False}
    frozen = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 1e-12}
    module = ClassificationModule(net, [1, 4, 4], 3, frozen)
    with torch.no_grad():
        losses = [
            float(F.cross_entropy(module(x[i : i + 8]), y[i : i + 8])) for i in range(0, 64, 8)
        ]
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=CSVLogger(tmp_path, name="", version=""),
        log_every_n_steps=1,
        accumulate_grad_batches=accumulate,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=8))
    assert float(trainer.callback_metrics["train/loss"]) == pytest.approx(sum(losses) / 8)
    assert 0 <= float(trainer.callback_metrics["train/acc"]) <= 1
    with (tmp_path / "metrics.csv").open() as f:
        logged = [
            float(row["train/loss_step"]) for row in csv.DictReader(f) if row.get("train/loss_step")
        ]
    assert logged == pytest.approx(losses[accumulate - 1 :: accumulate], rel=1e-5)
