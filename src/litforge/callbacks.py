"""Callbacks of our own, where Lightning's need a change."""

from __future__ import annotations

import json
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar as _LightningRichProgressBar


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
