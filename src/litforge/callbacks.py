"""Our own callbacks, each in conf/callbacks/ (those about checkpoints: `litforge.checkpoints`)."""

import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import lightning as L
import rich
import torch
from lightning.pytorch.callbacks import LearningRateMonitor as _LightningLearningRateMonitor
from lightning.pytorch.callbacks import RichModelSummary as _LightningRichModelSummary
from lightning.pytorch.callbacks import RichProgressBar as _LightningRichProgressBar
from lightning.pytorch.utilities.data import extract_batch_size
from omegaconf import OmegaConf
from rich.progress import ProgressColumn, Task
from rich.table import Table
from rich.text import Text

from litforge import plots
from litforge.errors import UserError

log = logging.getLogger(__name__)


class _Speed(ProgressColumn):
    """Batches a second; the mean since the start where rich has none (Lightning's: `0.00it/s`)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if speed is None and task.completed and task.elapsed:
            speed = task.completed / task.elapsed
        return Text(f"{speed:.2f}it/s" if speed else "", style="dim underline")


class RichProgressBar(_LightningRichProgressBar):
    """Redrawn every `refresh_rate` (config: 20) batches on rank 0 only: Lightning's (2.6.6) after
    every batch, ~1 ms a step on a CPU (Lightning #13937, #20300). Shows this epoch's training."""

    def configure_columns(self, trainer: L.Trainer) -> list:
        return [*super().configure_columns(trainer)[:-1], _Speed()]  # (the last: the speed)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        statistics = [cb for cb in trainer.callbacks if isinstance(cb, EpochStatistics)]
        if not statistics or trainer.state.fn != "fit":
            return metrics
        for name in list(metrics):  # the logged values: the previous epoch's
            if name.startswith(statistics[0].prefix) and not name.endswith("_step"):
                del metrics[name]
        return {**statistics[0].running(), **metrics}

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


class RichModelSummary(_LightningRichModelSummary):
    """Without the FLOPs column and `Total FLOPs: 0` where none were counted: Lightning counts
    them only on an `example_input_array`, which the pipeline sets only for a logger's graph."""

    @staticmethod
    def summarize(*args: Any, total_flops: int, **kwargs: Any) -> None:
        if total_flops:
            _LightningRichModelSummary.summarize(*args, total_flops=total_flops, **kwargs)
            return
        console = rich.get_console()

        def show(table: Table) -> None:  # what Lightning prints: its table, then its totals
            table.columns = [c for c in table.columns if c.header != "FLOPs"]
            if not table.show_header:  # the totals but the last, `Total FLOPs: 0`
                table = "\n".join(line.rstrip() for line in list(table.columns[0].cells)[:-1])
            console.print(table, highlight=False)

        with mock.patch("rich.get_console", return_value=SimpleNamespace(print=show)):
            _LightningRichModelSummary.summarize(*args, total_flops=0, **kwargs)


class LogRunConfig(L.Callback):
    """Log the resolved run config to every logger, with `batch_size.per_device` and `.global`.
    In `setup`, after `prepare_data`: a run whose data is missing leaves no logger files."""

    def __init__(self, run_config: Mapping[str, Any]) -> None:
        self.config = OmegaConf.to_container(OmegaConf.create(dict(run_config)), resolve=True)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        per_device = self.config.get("data", {}).get("batch_size", 0)
        # processes that see different data (tensor-parallel ranks share theirs)
        replicas = (trainer.distributed_sampler_kwargs or {}).get("num_replicas", 1)
        total = per_device * replicas * trainer.accumulate_grad_batches
        if trainer.is_global_zero and stage == "fit":
            log.info(
                f"Batch size: {per_device} per process x {replicas} data-parallel process(es) "
                f"x {trainer.accumulate_grad_batches} accumulated = {total}"
            )
        config = {**self.config, "batch_size": {"per_device": per_device, "global": total}}
        for logger in trainer.loggers:
            logger.log_hyperparams(config)


class LearningRateMonitor(_LightningLearningRateMonitor):
    """An epoch resumed mid-way has no start: its rates go into the run's metrics, not its logs."""

    _epoch_seen = -1

    def on_train_epoch_start(self, trainer, *args, **kwargs) -> None:
        self._epoch_seen = trainer.current_epoch
        super().on_train_epoch_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.logging_interval == "epoch" and self._epoch_seen != trainer.current_epoch:
            self._epoch_seen = trainer.current_epoch
            self._extract_stats(trainer, "epoch")  # into trainer.callback_metrics only
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)


class StopOnNonFiniteLoss(L.Callback):
    """Stop at the first NaN or infinite loss, saying where; earlier checkpoints stay untouched."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss")
        if loss is None:
            return
        bad = not bool(torch.isfinite(loss.detach()))
        if trainer.world_size > 1:  # every process stops together, whichever saw it
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if bad:
            kept = trainer.checkpoint_callback
            checkpoints = kept.dirpath if kept is not None else "(none: no checkpoint callback)"
            value = float(loss)
            seen = value if not math.isfinite(value) else "NaN/inf in another process"
            raise UserError(
                f"the training loss became {seen} at epoch {trainer.current_epoch}, step "
                f"{trainer.global_step} (batch {batch_idx}); training stopped. The checkpoints "
                f"of earlier epochs are in {checkpoints}. Lower model.optimizer.lr, or check the "
                "data for NaNs."
            )


class EpochStatistics(L.Callback):
    """Logs each value a training step returns (`loss`, and the others of `step_statistics`) as
    `<prefix><name>`, averaged over the epoch's samples on all processes (a step may return its
    own `batch_size`; 0: nothing to count), and as `<prefix><name>_step` on the steps loggers
    write. One tensor of sums on the device: µs, where `self.log(on_epoch=True)` costs ~0.25 ms."""

    def __init__(self, prefix: str = "train/") -> None:
        self.prefix = prefix
        self.names: list[str] = []
        self.sums: torch.Tensor | None = None  # value × samples for each name, then samples
        self._trainer: L.Trainer | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.sums = None  # (Lightning skips this hook in an epoch resumed mid-way)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        values = {k: v for k, v in outputs.items() if k != "batch_size"}
        n = outputs.get("batch_size", extract_batch_size(batch))
        if not values or not n:
            return
        self.names = self.names or list(values)
        with torch.no_grad():
            step = torch.stack([values[k].detach().float().reshape(()) for k in self.names])
            if "loss" in self.names:  # Lightning hands it on divided by the accumulation
                step[self.names.index("loss")] *= trainer.accumulate_grad_batches
            weighted = torch.cat([step * n, step.new_tensor([n])])
        self.sums = weighted if self.sums is None else self.sums.to(weighted.device) + weighted
        if trainer._logger_connector.should_update_logs:  # private API (Lightning 2.6)
            for name, value in zip(self.names, step, strict=True):
                pl_module.log(f"{self.prefix}{name}_step", value, on_step=True, on_epoch=False)

    def _total(self, trainer: L.Trainer) -> torch.Tensor:
        # Zeros where this process has counted nothing yet: every process must join the sum.
        sums = self.sums if self.sums is not None else torch.zeros(len(self.names) + 1)
        sums = sums.to(trainer.lightning_module.device).clone()
        return trainer.strategy.reduce(sums, reduce_op="sum")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.names:
            return
        *sums, count = self._total(trainer)
        if count > 0:  # sync_dist: as in ClassificationModule (equal on every process already)
            for name, total in zip(self.names, sums, strict=True):
                pl_module.log(f"{self.prefix}{name}", total / count, prog_bar=True, sync_dist=True)

    def running(self) -> dict[str, float]:
        """This epoch's averages so far on this process (what the progress bar shows)."""
        if self.sums is None or not self.sums[-1]:
            return {}
        *sums, count = self.sums.tolist()
        return {f"{self.prefix}{n}": s / count for n, s in zip(self.names, sums, strict=True)}

    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        if trainer is None or trainer.state.fn != "fit" or not self.names:
            return {}
        # Summed over processes (all of them save together), to be loaded into rank 0.
        return {"names": self.names, "sums": self._total(trainer).cpu()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        self.names, sums = list(state_dict["names"]), state_dict["sums"]
        rank = self._trainer.global_rank if self._trainer is not None else 0
        self.sums = sums if rank == 0 else torch.zeros_like(sums)


class ClassificationPlots(L.Callback):
    """`<dirpath>/curves.png` after training, `<dirpath>/confusion_matrix.png` after testing (rank
    0; also to TensorBoard, W&B). Epochs are recorded here (no logger needed), kept in checkpoints,
    and read at the first chance after `on_train_epoch_end`, as later hooks may still log them."""

    NAMES = ("train/loss", "train/acc", "val/loss", "val/acc")

    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)
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
        if trainer.is_global_zero and self.epochs:
            path = self.dirpath / "curves.png"
            self._publish(trainer, plots.curves(self.epochs, path), path)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        matrix = getattr(pl_module, "test_confusion_matrix", None)  # ClassificationModule's
        if trainer.is_global_zero and matrix is not None:
            names = pl_module.hparams.class_names or [str(i) for i in range(len(matrix))]
            path = self.dirpath / "confusion_matrix.png"
            self._publish(trainer, plots.confusion_matrix(matrix, names, path), path)

    @staticmethod
    def _publish(trainer: L.Trainer, figure: Any, path: Path) -> None:
        from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_figure(path.stem, figure)
            elif isinstance(logger, WandbLogger):
                logger.log_image(key=path.stem, images=[str(path)])
        plots.close(figure)

    def _record(self) -> None:
        if self._ended is None:
            return
        metrics = self._trainer.callback_metrics
        self.epochs[self._ended] = {n: float(metrics[n]) for n in self.NAMES if n in metrics}
        self._ended = None

    def state_dict(self) -> dict[str, Any]:
        self._record()  # checkpoints are written after the module's epoch-end hook
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epochs = dict(state_dict["epochs"])
