"""Our own callbacks, each in conf/callbacks/ (those about checkpoints: `litforge.checkpoints`)."""

import logging
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import lightning.pytorch.callbacks
import torch
from omegaconf import OmegaConf
from rich.progress import ProgressColumn, Task
from rich.text import Text

from litforge.errors import UserError

log = logging.getLogger(__name__)


class _Speed(ProgressColumn):
    """Batches a second; the mean since the start where rich has none (Lightning's: `0.00it/s`)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if speed is None and task.completed and task.elapsed:
            speed = task.completed / task.elapsed
        return Text(f"{speed:.2f}it/s" if speed else "", style="dim underline")


class RichProgressBar(lightning.pytorch.callbacks.RichProgressBar):
    """Redrawn every `refresh_rate` (config: 20) batches on rank 0 only: Lightning's (2.6.6) after
    every batch, ~1 ms a step on a CPU (Lightning #13937, #20300)."""

    def configure_columns(self, trainer: L.Trainer) -> list:
        return [*super().configure_columns(trainer)[:-1], _Speed()]  # (the last: the speed)

    def _due(self, batch_idx: int, total: Callable[[], int | float]) -> bool:
        # `total` is read on rank 0 only: elsewhere Lightning never sets up what it reads.
        n = batch_idx + 1
        return self.is_enabled and (n % self.refresh_rate == 0 or n >= total())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._due(batch_idx, lambda: self.total_train_batches):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args) -> None:
        if self._due(batch_idx, lambda: self.total_val_batches_current_dataloader):
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, *args)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args) -> None:
        if self._due(batch_idx, lambda: self.total_test_batches_current_dataloader):
            super().on_test_batch_end(trainer, pl_module, outputs, batch, batch_idx, *args)


class LogRunConfig(L.Callback):
    """Log the resolved run config to every logger, with `batch_size.per_device` and `.global`.
    In `setup`, after `prepare_data`: a run whose data is missing leaves no logger files."""

    def __init__(self, run_config: Mapping[str, Any]) -> None:
        self.config = OmegaConf.to_container(OmegaConf.create(dict(run_config)), resolve=True)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        config = self.config
        per_device = config.get("data", {}).get("batch_size")  # (a datamodule's own: unknown)
        if isinstance(per_device, int):
            # processes that see different data (ranks that split one model share theirs)
            replicas = (trainer.distributed_sampler_kwargs or {}).get("num_replicas", 1)
            total = per_device * replicas * trainer.accumulate_grad_batches
            if trainer.is_global_zero and stage == "fit":
                log.info(
                    f"Batch size: {per_device} per process x {replicas} data-parallel "
                    f"process(es) x {trainer.accumulate_grad_batches} accumulated = {total}"
                )
            config = {**config, "batch_size": {"per_device": per_device, "global": total}}
        for logger in trainer.loggers:
            logger.log_hyperparams(config)


class LearningRateMonitor(lightning.pytorch.callbacks.LearningRateMonitor):
    """Lightning's, which logs per epoch when an epoch starts: an epoch resumed mid-way, which
    Lightning starts without that hook, gets its rates into the run's metrics at its first batch
    (not into the loggers, which have them from before the stop)."""

    _epoch = -1  # the epoch whose start was seen

    def on_train_epoch_start(self, trainer, *args: Any, **kwargs: Any) -> None:
        self._epoch = trainer.current_epoch
        super().on_train_epoch_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.logging_interval == "epoch" and self._epoch != trainer.current_epoch:
            loggers, trainer.loggers = trainer.loggers, []
            try:
                self.on_train_epoch_start(trainer, pl_module)
            finally:
                trainer.loggers = loggers
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)


class StopOnNonFiniteLoss(L.Callback):
    """Stop once a training loss was NaN or infinite, saying at which step, before any later
    checkpoint is written. Each step only keeps its loss (on its device: a check every step
    would wait for the GPU); they are checked every `log_every_n_steps` optimizer steps (and
    every `MAX_KEPT` losses), at an epoch's end, and before each checkpoint, where the
    processes of a job agree (a NaN on one makes every process's weights NaN)."""

    MAX_KEPT = 1024

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []  # since the last check
        self.steps: list[int] = []  # their steps
        self.checked_at = -1  # the step of the last periodic check

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.losses, self.steps = [], []

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        self.losses.append(loss.detach() if loss.ndim == 0 else loss.detach().sum())
        self.steps.append(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, every = trainer.global_step, trainer.log_every_n_steps
        due = every and step % every == 0 and step != self.checked_at  # (once per step)
        if due or len(self.losses) >= self.MAX_KEPT:
            self.checked_at = step
            self.check(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        self.check(trainer, agree=trainer.world_size > 1)  # (every process saves together)

    def check(self, trainer: L.Trainer, agree: bool = False) -> None:
        """Raise if a kept loss is not finite; with `agree`, if one is on any process of the job
        (a collective). Otherwise this process's own only: processes may step apart (workers
        that train asynchronously), and the others stop at their next check."""
        if trainer.state.fn != "fit":
            return
        bad_step = None
        if self.losses:
            finite = torch.isfinite(torch.stack(self.losses))
            steps, self.losses, self.steps = self.steps, [], []
            if not finite.all():  # (one wait for the device per check)
                bad_step = steps[int(finite.logical_not().nonzero()[0])]
        anywhere = bad_step is not None
        if agree:
            anywhere = trainer.strategy.reduce_boolean_decision(anywhere, all=False)
        if anywhere:
            where = f"at step {bad_step}" if bad_step is not None else "on another process"
            kept = trainer.checkpoint_callback
            checkpoints = kept.dirpath if kept is not None else "(none: no checkpoint callback)"
            raise UserError(
                f"the training loss became NaN or infinite {where} (epoch "
                f"{trainer.current_epoch}); training stopped. The checkpoints of earlier epochs "
                f"are in {checkpoints}. Lower model.optimizer.lr, or check the data for NaNs."
            )
