"""The LightningModule that trains any backbone network on a classification task, and the
callback that draws its pictures (`ClassificationPlots`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torchmetrics import MaxMetric, MeanMetric, MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
)

from litforge import plots
from litforge.errors import UserError, number_problem
from litforge.models import NETWORKS, OPTIMIZERS


def check_buildable(config: Any, key: str, allowed: Sequence[str], prefix: bool = False) -> None:
    """A UserError unless `config` builds one of `allowed` (`prefix`: a name starting with one of
    them) from plain values: no nested `_target_`, no `${...}` interpolation (a resolver such as
    `oc.decode` could produce one). Checked before anything is built, whether the config comes
    from Hydra or from a checkpoint (see litforge/models/__init__.py)."""
    if config is None:
        return
    config = _plain(config)
    target = config.get("_target_") if isinstance(config, Mapping) else None
    named = isinstance(target, str) and (
        target.startswith(tuple(allowed)) if prefix else target in allowed
    )
    if not named:
        what, listed = ("names starting with", "OPTIMIZERS") if prefix else ("only", "NETWORKS")
        raise UserError(
            f"{key}._target_={target} is not allowed: a model may build {what} "
            f"{', '.join(allowed)}. If it is yours, add it to litforge.models.{listed} "
            f"(src/litforge/models/__init__.py); a checkpoint that names it is not loaded."
        )

    def refuse(value: Any, where: str) -> None:
        if isinstance(value, Mapping):
            if "_target_" in value:
                raise UserError(
                    f"{where} has a _target_ of its own ({value['_target_']}): a model's "
                    f"{key} is built from plain values only."
                )
            for k, v in value.items():
                refuse(v, f"{where}.{k}")
        elif isinstance(value, Sequence) and not isinstance(value, str):
            for i, v in enumerate(value):
                refuse(v, f"{where}[{i}]")
        elif isinstance(value, str) and "${" in value:
            raise UserError(
                f"{where}={value} is an interpolation: a model's {key} takes plain values."
            )

    for k, v in config.items():
        if k != "_target_":
            refuse(v, f"{key}.{k}")


def _plain(config: Any) -> Any:
    """A DictConfig as plain dicts and lists: checkpoints must load with weights_only=True."""
    if isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)
    return config


class ClassificationModule(L.LightningModule):
    """Cross-entropy training of `net` with TorchMetrics evaluation.

    `net`, `optimizer` and `scheduler` are Hydra configs (`_target_`; the latter two
    `_partial_: true`), stored as plain dicts in the checkpoint. So
    `ClassificationModule.load_from_checkpoint(path, weights_only=True)` rebuilds the model
    without Hydra, on torch >= 2.6 too: no module or function is pickled.

    Logged: `{train,val,test}/loss`, `/acc`, `val|test/f1` (macro), `val|test/acc_balanced`
    (the mean of the per-class recalls, for imbalanced classes), `val/acc_best`.
    """

    def __init__(
        self,
        net: Mapping[str, Any],
        input_shape: Sequence[int],
        num_classes: int,
        optimizer: Mapping[str, Any],
        scheduler: Mapping[str, Any] | None = None,
        class_names: Sequence[str] | None = None,
        channels_last: bool = False,
        compile: bool = False,
        class_weights: Sequence[float] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        check_buildable(net, "model.net", NETWORKS)
        check_buildable(optimizer, "model.optimizer", OPTIMIZERS, prefix=True)
        check_buildable(scheduler, "model.scheduler", OPTIMIZERS, prefix=True)
        for problem in (
            "lr" in optimizer and number_problem("optimizer.lr", optimizer["lr"], above=True),
            optimizer.get("weight_decay") is not None
            and number_problem("optimizer.weight_decay", optimizer["weight_decay"]),
        ):
            if problem:
                raise ValueError(problem)
        self.save_hyperparameters(
            {
                "net": _plain(net),
                "input_shape": list(input_shape),
                "num_classes": int(num_classes),
                "optimizer": _plain(optimizer),
                "scheduler": _plain(scheduler),
                "class_names": list(class_names) if class_names is not None else None,
                # Changes the numerics slightly (other conv kernels): kept, so that a loaded
                # checkpoint computes exactly what the training run computed.
                "channels_last": bool(channels_last),
                # `data.balance=loss`: the training loss weighs each class by these.
                "class_weights": list(class_weights) if class_weights is not None else None,
                # How the data normalized uint8 pixels (per channel, of pixels scaled to [0, 1]):
                # what predict.py, export.py and serve.py apply to new images.
                "mean": [float(v) for v in mean] if mean is not None else None,
                "std": [float(v) for v in std] if std is not None else None,
            },
            logger=False,  # the pipeline logs the whole resolved run config instead
        )
        # How to run the network, not what it is: kept out of the checkpoint, so that a
        # checkpoint from a compiled run loads into an eager one and the other way round.
        self.compile_net = compile
        self.net = instantiate(self.hparams.net, input_shape=input_shape, num_classes=num_classes)
        weights = torch.tensor(class_weights, dtype=torch.float32) if class_weights else None
        self.register_buffer("class_weights", weights, persistent=False)

        def metrics(prefix: str) -> MetricCollection:
            return MetricCollection(
                {
                    "acc": MulticlassAccuracy(num_classes, average="micro"),
                    "f1": MulticlassF1Score(num_classes, average="macro"),
                    "acc_balanced": MulticlassAccuracy(num_classes, average="macro"),
                },
                prefix=prefix,
            )

        # Validation and test use TorchMetrics (synced across processes); training statistics
        # are cheaper running sums (see training_step).
        self.val_metrics = metrics("val/")
        self.test_metrics = metrics("test/")
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.test_confusion = MulticlassConfusionMatrix(num_classes)  # for plots/, after test
        self.test_confusion_matrix: torch.Tensor | None = None
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # part of the checkpoint, so a resumed run keeps it
        self._train_sums: torch.Tensor | None = None  # loss × n, correct, n over this epoch
        self._pipeline = None  # litforge.stages.Pipeline under strategy.pipeline_parallel_size > 1

    @property
    def automatic_optimization(self) -> bool:
        # False under the Trainer whose configure_model call this module had: Lightning checks
        # what it refuses to a module that steps itself (clipping, accumulation) when a fit
        # starts, before configure_model, so a new Trainer (a second fit) must see True there.
        return self._trainer is None or self._trainer is not getattr(self, "_stepping_for", None)

    def configure_model(self) -> None:
        # Lightning calls this once the strategy is set up, on every run (fit, test, ...), and
        # after it checked the Trainer's settings against the module's: see training_step.
        self._stepping_for = self._trainer  # see automatic_optimization
        if getattr(self, "_configured", False):
            return
        self._configured = True
        if self.hparams.channels_last:  # NHWC weights: ~1.6x faster convolutions on CPUs
            self.net.to(memory_format=torch.channels_last)
        strategy = self.trainer.strategy if self._trainer is not None else None
        if self.device_mesh is not None and getattr(strategy, "pipeline_parallel_size", 1) > 1:
            from litforge.stages import Pipeline

            # The schedule runs the forward and backward passes of all microbatches.
            self._pipeline = Pipeline(
                self.net,
                self.device_mesh,
                strategy.schedule,
                strategy.microbatches,
                self._training_loss,
                strategy.root_device,
                compile=self.compile_net,
            )
        elif self.device_mesh is not None:  # strategy=model_parallel: FSDP2 / tensor parallel
            from litforge.parallelize import parallelize

            parallelize(self.net, self.device_mesh, compile=self.compile_net)
        elif self.compile_net:
            # In place: parameter names and state_dict keys keep no `_orig_mod.` prefix.
            self.net.compile()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _training_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # Validation and test losses stay unweighted: comparable with and without balancing.
        return F.cross_entropy(logits, y, weight=self.class_weights)

    # The optimizer is stepped here rather than by Lightning's automatic optimization, whose
    # closure and extra hooks cost ~0.6 ms a step: as much as a small network's whole step on
    # a CPU (benchmarks/epoch_time.py). What the Trainer's settings ask for is kept: gradient
    # accumulation (`trainer.accumulate_grad_batches`), clipping (`trainer.gradient_clip_val`,
    # in on_before_optimizer_step), mixed precision (`manual_backward` and the optimizer's
    # `step` go through Lightning's precision plugin) and the learning-rate schedulers.
    # Lightning refuses the first two for a module that steps its own optimizer, but checks
    # that before `configure_model`, where this module switches over (automatic_optimization).
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        optimizer = self.optimizers()
        accumulate = self.trainer.accumulate_grad_batches
        # (A loader without a length, e.g. an async parameter server's, ends when it ends.)
        last_batch = batch_idx + 1 == self.trainer.num_training_batches or (
            self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        )
        steps = (batch_idx + 1) % accumulate == 0 or last_batch  # as Lightning does
        if batch_idx % accumulate == 0:
            optimizer.zero_grad()
        if self._pipeline is not None:
            # Forward and backward; logits and loss only on the last stage (rank 0 holds the
            # first, so no step loss is logged on this path: the epoch's train/loss is).
            logits, loss, y = self._pipeline.train_step(x, y)
        else:
            logits = self(x)
            loss = self._training_loss(logits, y)
            if steps:
                self.manual_backward(loss / accumulate)
            else:  # gradients still being accumulated: no all-reduce across processes yet
                with optimizer.toggle_model(sync_grad=False):
                    self.manual_backward(loss / accumulate)
            # The per-step loss only on the steps the logger writes anyway.
            if (self.global_step + 1) % self.trainer.log_every_n_steps == 0:
                # (Not on the progress bar: it shows the epoch's running train/loss.)
                self.log("train/loss_step", loss, on_step=True, on_epoch=False)
        if steps:
            optimizer.step()
            self._step_schedulers("step", batch_idx + 1)
        if last_batch:  # before validation and the epoch's checkpoint, as Lightning does
            self._step_schedulers("epoch", self.current_epoch + 1)
        if logits is None:  # a value all the same: callbacks compare it across processes
            return torch.zeros((), device=self.device)
        self._add_to_epoch_sums(logits, loss, y)
        return loss.detach()

    def on_before_optimizer_step(self, optimizer) -> None:
        # Lightning calls this hook after mixed precision unscaled the gradients.
        self.configure_gradient_clipping(
            optimizer, self.trainer.gradient_clip_val, self.trainer.gradient_clip_algorithm
        )

    def _step_schedulers(self, interval: str, count: int, on_plateau: bool = False) -> None:
        """Step the schedulers of this `interval` whose `frequency` divides `count` (the batch
        of the epoch or the epoch, from 1), as Lightning would. ReduceLROnPlateau steps once an
        epoch, after validation (`on_plateau`), on the value of `model.scheduler.monitor`."""
        for config in self.trainer.lr_scheduler_configs:
            plateau = isinstance(config.scheduler, ReduceLROnPlateau)
            if plateau != on_plateau or count % config.frequency:
                continue
            if not plateau and config.interval != interval:
                continue
            value = None
            if plateau:
                monitor = self.hparams.scheduler.get("monitor")
                value = self.trainer.callback_metrics.get(monitor)
                if value is None:
                    raise UserError(
                        f"model.scheduler.monitor={monitor} was not logged by epoch "
                        f"{self.current_epoch}, and ReduceLROnPlateau steps on it. Logged: "
                        f"{', '.join(sorted(self.trainer.callback_metrics))}."
                    )
            self.lr_scheduler_step(config.scheduler, value)

    def _add_to_epoch_sums(self, logits: torch.Tensor, loss: torch.Tensor, y: torch.Tensor):
        # Epoch statistics as running sums: `self.log` costs ~1 ms a call on a CPU, a metric
        # object's update ~0.8 ms; these additions cost microseconds.
        with torch.no_grad():
            n = torch.tensor(len(y), device=loss.device)
            correct = (logits.argmax(dim=1) == y).sum()
            sums = torch.stack([loss.detach() * n, correct, n]).float()
            self._train_sums = sums if self._train_sums is None else self._train_sums + sums

    def on_train_epoch_start(self) -> None:
        self._train_sums = None

    def running_train_metrics(self) -> dict[str, float | None]:
        """This epoch's train/loss and train/acc so far on this process, for the progress bar
        (`litforge.callbacks.RichProgressBar`); None before a batch was counted here."""
        if self._train_sums is None:
            return {"train/loss": None, "train/acc": None}
        loss_sum, correct, count = self._train_sums.tolist()
        if not count:
            return {"train/loss": None, "train/acc": None}
        return {"train/loss": loss_sum / count, "train/acc": correct / count}

    def _epoch_sums(self) -> torch.Tensor:
        # Zeros, not nothing, where this process has no batch yet: every process must join
        # the reductions below, or the others wait for it.
        if self._train_sums is None:
            return torch.zeros(3, device=self.device)
        return self._train_sums

    # The epoch's sums so far travel with a mid-epoch checkpoint (a kill, a SIGTERM, or
    # `every_n_train_steps`), so that a resumed epoch reports the same train/loss and train/acc.
    # Summed over processes when saving (all of them save together); loaded into rank 0.
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self._trainer is not None and self.trainer.state.fn == "fit":
            total = self.trainer.strategy.reduce(self._epoch_sums().clone(), reduce_op="sum")
            checkpoint["train_epoch_sums"] = total.cpu()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        sums = checkpoint.get("train_epoch_sums")
        if sums is not None:
            rank = self._trainer.global_rank if self._trainer is not None else 0
            self._train_sums = sums.to(self.device) if rank == 0 else torch.zeros_like(sums)

    def on_train_epoch_end(self) -> None:
        self._step_schedulers("epoch", self.current_epoch + 1, on_plateau=True)
        # Summed over all processes, then divided: exact under DDP however batches fall. (A
        # copy: the reduction works in place.)
        total = self.trainer.strategy.reduce(self._epoch_sums().clone(), reduce_op="sum")
        loss_sum, correct, count = total
        if count == 0:
            return
        self.log("train/loss", loss_sum / count, prog_bar=True)
        self.log("train/acc", correct / count, prog_bar=True)

    def _evaluate(self, batch, metrics: MetricCollection, loss: MeanMetric) -> torch.Tensor | None:
        x, y = batch
        logits = self._pipeline.forward(x, y) if self._pipeline is not None else self(x)
        if logits is None:  # a pipeline stage before the last: nothing to count here
            return None
        loss.update(F.cross_entropy(logits, y), weight=len(y))
        metrics.update(logits, y)
        return logits

    def _log_evaluation(self, metrics: MetricCollection, loss: MeanMetric, prefix: str) -> dict:
        # Logged once per epoch rather than every step (each `self.log` costs ~1 ms on a CPU).
        # `compute()` syncs the metric states across processes itself.
        values = {**metrics.compute(), f"{prefix}/loss": loss.compute()}
        metrics.reset()
        loss.reset()
        self.log_dict(values, prog_bar=True)
        return values

    def validation_step(self, batch, batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics, self.val_loss)

    def test_step(self, batch, batch_idx: int) -> None:
        logits = self._evaluate(batch, self.test_metrics, self.test_loss)
        if logits is not None:
            self.test_confusion.update(logits, batch[1])

    def on_validation_epoch_end(self) -> None:
        values = self._log_evaluation(self.val_metrics, self.val_loss, "val")
        # The sanity check runs on untrained weights: not a best. (No reset at train start
        # either: a resumed run keeps the best of the run it continues.)
        if not self.trainer.sanity_checking:
            self.val_acc_best.update(values["val/acc"])
            self.log("val/acc_best", self.val_acc_best.compute(), prog_bar=True)

    def on_test_epoch_end(self) -> None:
        self._log_evaluation(self.test_metrics, self.test_loss, "test")
        self.test_confusion_matrix = self.test_confusion.compute().cpu()  # synced over processes
        self.test_confusion.reset()

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = instantiate(self.hparams.optimizer)(params=self.parameters())
        if not self.hparams.scheduler:
            return {"optimizer": optimizer}
        scheduler_cfg = dict(self.hparams.scheduler)
        # Lightning's scheduler settings ride along in the same config (`monitor`: what a
        # ReduceLROnPlateau steps on, read by _step_schedulers); the rest builds it.
        scheduler_cfg.pop("monitor", None)
        lightning_keys = {
            k: scheduler_cfg.pop(k) for k in ("interval", "frequency") if k in scheduler_cfg
        }
        scheduler = instantiate(scheduler_cfg)(optimizer=optimizer)
        if isinstance(scheduler, ReduceLROnPlateau) and not self.hparams.scheduler.get("monitor"):
            raise UserError(
                "model.scheduler: ReduceLROnPlateau steps on a logged metric, and "
                "model.scheduler.monitor is not set. Add +model.scheduler.monitor=val/loss "
                "(or another metric the run logs)."
            )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, **lightning_keys}}


class ClassificationPlots(L.Callback):
    """`<dirpath>/curves.png` (train and validation loss and accuracy per epoch) after training
    and `<dirpath>/confusion_matrix.png` after testing, on rank 0; also sent to TensorBoard and
    Weights & Biases when they log. Needs no logger: the epochs are recorded here, and kept in
    checkpoints so that a resumed run draws all of them.

    An epoch's training statistics are logged by the module's `on_train_epoch_end`, which
    Lightning calls after this callback's: the epoch is recorded at the next chance instead
    (the next epoch's start, the end of training, or a checkpoint being written).
    """

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

    def on_test_end(self, trainer: L.Trainer, pl_module: ClassificationModule) -> None:
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
