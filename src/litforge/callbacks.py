"""Callbacks of our own, each listed in conf/callbacks/ (the Optuna one in conf/hparams_search/).
The ones about checkpoints and resuming are in `litforge.resume`, the plots in
`litforge.models.classifier`."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar as _LightningRichProgressBar
from omegaconf import OmegaConf

from litforge.errors import UserError

log = logging.getLogger(__name__)


class RichProgressBar(_LightningRichProgressBar):
    """Lightning's rich progress bar, redrawn every `refresh_rate` batches.

    Lightning's version (2.6.6; cf. Lightning #13937, #20300) reads the logged metrics and redraws
    after every batch whatever its `refresh_rate`; on a CPU that costs about 1 ms a step, 10% of a
    small model's epoch.
    Processes other than rank 0 show no bar and skip all of it.
    """

    def __init__(self, refresh_rate: int = 20, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)

    def _due(self, batch_idx: int, total: Callable[[], int | float]) -> bool:
        # `total` is read on rank 0 only: on the others Lightning never sets up what it reads
        # (the current evaluation dataloader), and reading it fails.
        return self.is_enabled and (
            (batch_idx + 1) % self.refresh_rate == 0 or batch_idx + 1 >= total()
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._due(batch_idx, lambda: self.total_train_batches):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args) -> None:
        if self._due(batch_idx, lambda: self.total_val_batches_current_dataloader):
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, *args)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args) -> None:
        if self._due(batch_idx, lambda: self.total_test_batches_current_dataloader):
            super().on_test_batch_end(trainer, pl_module, outputs, batch, batch_idx, *args)


class OptunaPruning(L.Callback):
    """Report `monitor` to the Optuna trial after each validation epoch and stop training when
    the study's pruner says the trial is hopeless; the sweeper then records the trial as PRUNED.

    `trial` is what the Optuna sweeper (hydra_plugins.litforge.optuna_sweeper) hands each job of a
    search with a pruner, in the environment variable LITFORGE_OPTUNA_TRIAL (JSON: trial_id,
    study_name, storage, pruner); without it (a run outside a search) this does nothing.
    """

    def __init__(self, monitor: str, trial: str | None = None) -> None:
        self.monitor, self.trial = monitor, None
        if not trial:
            return
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

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.trial is None or trainer.sanity_checking:
            return
        if self.monitor not in trainer.callback_metrics:
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


class LogRunConfig(L.Callback):
    """Log the whole resolved run config to every logger (rather than the model's arguments),
    with the batch size per process and in total (`batch_size.per_device`, `batch_size.global`).

    `run_config` is filled in by the pipeline (a config cannot hold itself). In `setup`, which
    Lightning calls after `prepare_data`: a run whose data is missing leaves no logger files.
    """

    def __init__(self, run_config: Mapping[str, Any]) -> None:
        self.config = OmegaConf.to_container(OmegaConf.create(dict(run_config)), resolve=True)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        per_device = self.config.get("data", {}).get("batch_size", 0)
        # Data-parallel replicas: processes that see different data (tensor parallel ranks
        # share theirs), times gradient accumulation.
        replicas = (trainer.distributed_sampler_kwargs or {}).get("num_replicas", 1)
        total = per_device * replicas * trainer.accumulate_grad_batches
        if trainer.is_global_zero and stage == "fit":
            log.info(
                "Batch size: %d per process x %d data-parallel process(es) x %d accumulated = %d",
                per_device,
                replicas,
                trainer.accumulate_grad_batches,
                total,
            )
        config = {**self.config, "batch_size": {"per_device": per_device, "global": total}}
        for logger in trainer.loggers:
            logger.log_hyperparams(config)


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
