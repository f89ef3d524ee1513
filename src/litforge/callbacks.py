"""Callbacks of our own, where Lightning's need a change."""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.callbacks import RichProgressBar as _LightningRichProgressBar
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from litforge.errors import UserError

log = logging.getLogger(__name__)


class RichProgressBar(_LightningRichProgressBar):
    """Lightning's rich progress bar, redrawn every `refresh_rate` batches.

    Lightning's version reads the logged metrics and redraws after every batch whatever its
    `refresh_rate`; on a CPU that costs about 1 ms a step, 10% of a small model's epoch.
    Processes other than rank 0 show no bar and skip all of it.
    """

    def __init__(self, refresh_rate: int = 20, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)

    def _due(self, batch_idx: int, total: int | float) -> bool:
        return (batch_idx + 1) % self.refresh_rate == 0 or batch_idx + 1 >= total

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.is_enabled and self._due(batch_idx, self.total_train_batches):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        if self.is_enabled and self._due(batch_idx, self.total_val_batches_current_dataloader):
            super().on_validation_batch_end(
                trainer, pl_module, outputs, batch, batch_idx, dataloader_idx
            )

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        if self.is_enabled and self._due(batch_idx, self.total_test_batches_current_dataloader):
            super().on_test_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)


class EpochHistory(L.Callback):
    """Train and validation loss and accuracy of every epoch, for plots/curves.png, whatever
    the loggers (none included). Saved in checkpoints, so a resumed run draws all its epochs.

    An epoch's training statistics are logged by the module's `on_train_epoch_end`, which
    Lightning calls after this callback's: the epoch is recorded at the next chance instead
    (the next epoch's start, the end of training, or a checkpoint being written).
    """

    NAMES = ("train/loss", "train/acc", "val/loss", "val/acc")

    def __init__(self) -> None:
        self.epochs: dict[int, dict[str, float]] = {}
        self._ended: int | None = None  # an epoch whose statistics are yet to be read
        self._trainer: L.Trainer | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._ended = trainer.current_epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._record()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._record()

    def _record(self) -> None:
        if self._ended is None or self._trainer is None:
            return
        metrics = self._trainer.callback_metrics
        self.epochs[self._ended] = {n: float(metrics[n]) for n in self.NAMES if n in metrics}
        self._ended = None

    def state_dict(self) -> dict[str, Any]:
        self._record()  # checkpoints are written after the module's epoch-end hook
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epochs = dict(state_dict["epochs"])


# Set by the Optuna sweeper (hydra_plugins.litforge.optuna_sweeper) for each job when the
# search has a pruner: JSON with trial_id, study_name, storage and pruner (a `_target_` config).
OPTUNA_TRIAL_ENV = "LITFORGE_OPTUNA_TRIAL"


class OptunaPruning(L.Callback):
    """Report `monitor` to the Optuna trial after each validation epoch and stop training when
    the study's pruner says the trial is hopeless. The sweeper then records it as PRUNED.

    `pipeline.build_trainer` adds it when the job was started by the Optuna sweeper.
    """

    def __init__(self, trial: str, monitor: str) -> None:
        import optuna
        from hydra.utils import instantiate

        spec = json.loads(trial)
        study = optuna.load_study(
            study_name=spec["study_name"],
            storage=spec["storage"],
            pruner=instantiate(spec["pruner"]),  # the search's pruner decides
        )
        # Optuna's way to reach a trial from another process: the study and the trial's id.
        self.trial = optuna.trial.Trial(study, spec["trial_id"])
        self.monitor = monitor

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        epoch = trainer.current_epoch
        prune = False
        if trainer.is_global_zero:
            self.trial.report(float(trainer.callback_metrics[self.monitor]), step=epoch)
            prune = self.trial.should_prune()
            if prune:
                self.trial.set_user_attr("pruned_at_epoch", epoch)
                print(f"Optuna pruned trial {self.trial.number} after epoch {epoch}.", flush=True)
        # Every process stops together, as rank 0 decided.
        trainer.should_stop = trainer.should_stop or trainer.strategy.broadcast(prune)


class LastCheckpoint(ModelCheckpoint):
    """`checkpoints/last.ckpt` after every training epoch, and mid-epoch when the job is told to
    stop (SIGTERM: preemption, `scancel`, a scheduler's time limit), before exiting.

    The best checkpoint (`model_checkpoint`) is another callback: Lightning's `save_last` only
    refreshes last.ckpt when a new best is saved, so a resumed run could go back many epochs.
    """

    def __init__(self, dirpath: str) -> None:
        super().__init__(
            dirpath=dirpath,
            filename="last",
            monitor=None,
            save_top_k=1,
            save_on_train_epoch_end=True,  # after validation and the epoch's statistics
            enable_version_counter=False,  # overwrite last.ckpt, never last-v1.ckpt
        )

    @property
    def path(self) -> Path:
        return Path(self.dirpath) / f"{self.filename}{self.FILE_EXTENSION}"

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        if trainer.is_global_zero:
            log.info(
                f"Saved {filepath} (epoch {trainer.current_epoch}, step {trainer.global_step})"
            )

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # Stopped between two batches of training: save them. (Not when testing: the weights
        # are then those of the best checkpoint.)
        if isinstance(exception, SIGTERMException) and trainer.state.fn == TrainerFn.FITTING:
            self._save_checkpoint(trainer, str(self.path))


class ResumeState(L.Callback):
    """Put the random number generators into checkpoints and back, so that a resumed run draws
    the same dropout masks and augmentations as the run it continues (Lightning saves model,
    optimizer, scheduler, loops and data position, not the RNGs)."""

    def __init__(self) -> None:
        self._states: dict[str, Any] | None = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        states = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states["cuda"] = torch.cuda.get_rng_state_all()
        checkpoint["rng_states"] = states

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        self._states = checkpoint.get("rng_states")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Here rather than when loading: after the sanity check, right before the first batch,
        # where the interrupted run also was.
        if self._states is None:
            return
        torch.set_rng_state(self._states["torch"])
        random.setstate(self._states["python"])
        if "cuda" in self._states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(self._states["cuda"])
        self._states = None


class StopOnNonFiniteLoss(L.Callback):
    """Stop training at the first step whose loss is NaN or infinite, saying where; the
    checkpoints of earlier epochs stay as they were (nothing is saved from broken weights)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        bad = not bool(torch.isfinite(loss.detach()))
        if trainer.world_size > 1:  # every process stops together, whichever saw it
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if bad:
            kept = trainer.checkpoint_callback
            checkpoints = kept.dirpath if kept is not None else "(none: no checkpoint callback)"
            value = float(loss)
            where = "" if not math.isfinite(value) else " in another process"
            raise UserError(
                f"the training loss became {'NaN/inf' if where else value}{where} at epoch "
                f"{trainer.current_epoch}, "
                f"step {trainer.global_step} (batch {batch_idx}); training stopped. The "
                f"checkpoints of earlier epochs are in {checkpoints}. Lower "
                f"model.optimizer.lr, or check the data for NaNs."
            )
