"""The LightningModule that trains any backbone network on a classification task."""

import contextlib
import functools
import os
from collections.abc import Mapping, Sequence
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

from litforge import checkpoints
from litforge import models as registry  # read when used: a test or fork may extend it
from litforge.callbacks import EpochStatistics
from litforge.errors import UserError, check_number


def registered_name(target: object, allowed: Sequence[str]) -> str | None:
    """The entry of `allowed` that `target` names, or None: the entry itself, or the path where
    its class is defined. Nothing is imported by `target`'s own name: a checkpoint's names never
    choose what code runs, not even which modules load."""
    if not isinstance(target, str):
        return None
    return target if target in allowed else _defined_at(tuple(allowed)).get(target)


@functools.cache
def _defined_at(allowed: tuple[str, ...]) -> dict[str, str]:
    """`module.qualname` of each listed class → its listed name (only listed names import)."""
    from hydra.utils import get_object

    found = {}
    for name in allowed:
        with contextlib.suppress(Exception):  # a listed network whose extra is not installed
            obj = get_object(name)
            found[f"{obj.__module__}.{obj.__qualname__}"] = name
    return found


def check_buildable(config: Any, key: str, allowed: Sequence[str], partial: bool = False) -> Any:
    """`config` as plain dicts and lists (checkpoints must load with weights_only=True), its
    `_target_` the registered name; a UserError unless it builds one of `allowed` from plain
    values: no other `_target_`, no `${...}` (`oc.decode` could make one), no Hydra keyword but
    `_partial_: true` (`partial`: an optimizer or scheduler, given its parameters later)."""
    if isinstance(config, DictConfig):
        config = OmegaConf.to_container(config, resolve=True)
    if config is None:
        return None
    target = config.get("_target_") if isinstance(config, Mapping) else None
    name = registered_name(target, allowed)
    if name is None:
        listed = {"model.net": "NETWORKS", "model.scheduler": "SCHEDULERS"}.get(key, "OPTIMIZERS")
        raise UserError(
            f"{key}._target_={target} is not allowed: a model builds only what "
            f"litforge.models.{listed} lists (src/litforge/models/__init__.py). If it is yours, "
            f"add it there; a checkpoint that names anything else is not loaded."
        )
    if not all(isinstance(k, str) for k in config):
        raise UserError(f"{key} has keys that are no names: {list(config)}.")
    keywords = {k for k in config if k.startswith("_") and k.endswith("_")} - {"_target_"}
    if keywords - ({"_partial_"} if partial else set()):
        raise UserError(
            f"{key} has {', '.join(sorted(keywords))}: a model's {key} is built from its "
            f"_target_ and plain values{' (and _partial_: true)' if partial else ''} only."
        )
    if partial and config.get("_partial_") is not True:
        raise UserError(
            f"{key}._partial_ must be true: the model gives it the parameters when it builds it."
        )

    def refuse(value: Any, where: str) -> None:
        if isinstance(value, Mapping):
            if not all(isinstance(k, str) for k in value):
                raise UserError(f"{where} has keys that are no names: {list(value)}.")
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

    refuse({k: v for k, v in config.items() if k != "_target_"}, key)
    return {**config, "_target_": name}


def check_settings(
    input_shape: Any,
    num_classes: Any,
    class_names: Any = None,
    class_weights: Any = None,
    mean: Any = None,
    std: Any = None,
) -> None:
    """The module's plain settings are of the right kinds (a checkpoint's are data, never configs
    to build): a UserError naming the first that is not."""

    def listed(value: Any, kind: type | tuple[type, ...]) -> bool:
        return (
            isinstance(value, Sequence)
            and not isinstance(value, str)
            and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
        )

    if not (listed(input_shape, int) and len(input_shape) == 3 and min(input_shape) > 0):
        raise UserError(f"input_shape={input_shape!r} is no (channels, height, width) of pixels.")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise UserError(f"num_classes={num_classes!r} is no number of classes (2 or more).")
    if class_names is not None and not listed(class_names, str):
        raise UserError(f"class_names={class_names!r} is no list of names.")
    for name, value in (("class_weights", class_weights), ("mean", mean), ("std", std)):
        if value is not None and not listed(value, (int, float)):
            raise UserError(f"{name}={value!r} is no list of numbers.")


class ClassificationModule(L.LightningModule):
    """`net`, `optimizer` and `scheduler` are Hydra configs (the latter two `_partial_: true`) kept
    as plain dicts: `load_from_checkpoint(path, weights_only=True)` rebuilds without Hydra or
    pickles. Logged: `{train,val,test}/loss`, `/acc`, `val|test/f1` (macro), `val/acc_best`,
    `val|test/acc_balanced` (the mean of the per-class recalls, for imbalanced classes)."""

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
        label_smoothing: float = 0.0,
        backbone_lr_scale: float = 1.0,
    ) -> None:
        super().__init__()
        check_settings(input_shape, num_classes, class_names, class_weights, mean, std)
        net = check_buildable(net, "model.net", registry.NETWORKS)
        optimizer = check_buildable(optimizer, "model.optimizer", registry.OPTIMIZERS, partial=True)
        scheduler = check_buildable(scheduler, "model.scheduler", registry.SCHEDULERS, partial=True)
        if "lr" in optimizer:
            check_number("optimizer.lr", optimizer["lr"], above=True)
        if optimizer.get("weight_decay") is not None:
            check_number("optimizer.weight_decay", optimizer["weight_decay"])
        check_number("model.label_smoothing", label_smoothing)
        if label_smoothing >= 1:
            raise ValueError(
                f"model.label_smoothing={label_smoothing}: expected below 1 (0.1 is usual)."
            )
        check_number("model.backbone_lr_scale", backbone_lr_scale)
        self.save_hyperparameters(
            {
                # `pretrained*` settings start the weights; the checkpoint holds them from then on.
                "net": {k: v for k, v in net.items() if not k.startswith("pretrained")},
                "input_shape": list(input_shape),
                "num_classes": int(num_classes),
                "optimizer": optimizer,
                "scheduler": scheduler,
                "class_names": list(class_names) if class_names is not None else None,
                "channels_last": bool(channels_last),  # other kernels: computes as in training
                # `data.balance=loss`: the training loss weighs each class by these.
                "class_weights": list(class_weights) if class_weights is not None else None,
                # How the data normalized [0, 1] pixels per channel: new images get the same.
                "mean": [float(v) for v in mean] if mean is not None else None,
                "std": [float(v) for v in std] if std is not None else None,
                "label_smoothing": float(label_smoothing),
                "backbone_lr_scale": float(backbone_lr_scale),
            },
            logger=False,  # the pipeline logs the whole resolved run config instead
        )
        self.compile_net = compile  # not checkpointed: a compiled run's loads into an eager one
        # Not recursive: only `net` itself is built, never what the arguments hold.
        self.net = instantiate(
            net, input_shape=tuple(input_shape), num_classes=num_classes, _recursive_=False
        )
        weights = torch.tensor(class_weights, dtype=torch.float32) if class_weights else None
        self.register_buffer("class_weights", weights, persistent=False)

        metrics = MetricCollection(  # synced over processes; training's: callbacks.EpochStatistics
            {
                "acc": MulticlassAccuracy(num_classes, average="micro"),
                "f1": MulticlassF1Score(num_classes, average="macro"),
                "acc_balanced": MulticlassAccuracy(num_classes, average="macro"),
            }
        )
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.test_confusion = MulticlassConfusionMatrix(num_classes)  # for plots/, after test
        self.test_confusion_matrix: torch.Tensor | None = None
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # part of the checkpoint, so a resumed run keeps it

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, *args: Any, **kwargs: Any):
        """Lightning's, once `checkpoints.read_checkpoint` has checked a local file: what it names
        is registered in `litforge.models` and its settings are plain values (it is data)."""
        if isinstance(checkpoint_path, (str, os.PathLike)) and os.path.exists(checkpoint_path):
            checkpoints.read_checkpoint(checkpoint_path)
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def configure_callbacks(self) -> list[L.Callback]:
        # train/loss, train/acc. Once per Trainer: Lightning would say it replaces the first.
        trainer = self._trainer
        if trainer is not None and any(isinstance(c, EpochStatistics) for c in trainer.callbacks):
            return []
        return [EpochStatistics()]

    def configure_model(self) -> None:
        if getattr(self, "_configured", False):  # Lightning calls this on every run
            return
        self._configured = True
        if self.hparams.channels_last:  # NHWC weights: ~1.6x faster convolutions on CPUs
            self.net.to(memory_format=torch.channels_last)
        if self.compile_net:
            self.net.compile()  # in place: state_dict keys get no `_orig_mod.` prefix

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss; validation and test stay unweighted, comparable across `balance`.
        `y`: class indices, or per-class probabilities (`data.mix` blends images and labels)."""
        smoothing = self.hparams.label_smoothing
        return F.cross_entropy(logits, y, weight=self.class_weights, label_smoothing=smoothing)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        logits = self(x)
        return self.step_statistics(logits, y, self.loss(logits, y))

    def step_statistics(
        self, logits: torch.Tensor, y: torch.Tensor, loss: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Each value is logged as `train/<name>` by `EpochStatistics`: add statistics here."""
        labels = y.argmax(dim=1) if y.ndim > 1 else y  # a blend's larger share
        return {"loss": loss, "acc": (logits.argmax(dim=1) == labels).float().mean()}

    def validation_step(self, batch, batch_idx: int) -> None:
        self.update_metrics("val", self(batch[0]), batch[1])

    def test_step(self, batch, batch_idx: int) -> None:
        self.update_metrics("test", self(batch[0]), batch[1])

    def update_metrics(self, stage: str, logits: torch.Tensor, y: torch.Tensor) -> None:
        getattr(self, f"{stage}_loss").update(F.cross_entropy(logits, y), weight=len(y))
        getattr(self, f"{stage}_metrics").update(logits, y)
        if stage == "test":
            self.test_confusion.update(logits, y)

    def _log_evaluation(self, metrics: MetricCollection, loss: MeanMetric, prefix: str) -> dict:
        # Once an epoch (each `self.log` costs ~0.25 ms on a CPU); `compute()` syncs processes.
        values = {**metrics.compute(), f"{prefix}/loss": loss.compute()}
        metrics.reset()
        loss.reset()
        # sync_dist: the mean over processes of these equal values, as Lightning asks of values
        # logged once an epoch under DDP (one small all-reduce each, once an epoch).
        self.log_dict(values, prog_bar=True, sync_dist=True)
        return values

    def on_validation_epoch_end(self) -> None:
        values = self._log_evaluation(self.val_metrics, self.val_loss, "val")
        # Not the sanity check's untrained weights. Never reset: a resumed run keeps its best.
        if not self.trainer.sanity_checking:
            self.val_acc_best.update(values["val/acc"])
            self.log("val/acc_best", self.val_acc_best.compute(), prog_bar=True, sync_dist=True)

    def on_test_epoch_end(self) -> None:
        self._log_evaluation(self.test_metrics, self.test_loss, "test")
        self.test_confusion_matrix = self.test_confusion.compute().cpu()  # synced over processes
        self.test_confusion.reset()

    def parameter_groups(self) -> list[dict[str, Any]]:
        """The network's `backbone` (when it has one) learns at `backbone_lr_scale` × the rate."""
        backbone = getattr(self.net, "backbone", None)
        scale = self.hparams.backbone_lr_scale
        if not isinstance(backbone, torch.nn.Module) or scale == 1:
            return [{"params": list(self.parameters())}]
        if "lr" not in self.hparams.optimizer:
            raise UserError("model.backbone_lr_scale needs model.optimizer.lr to scale.")
        in_backbone = {id(p) for p in backbone.parameters()}
        head = [p for p in self.parameters() if id(p) not in in_backbone]
        lr = self.hparams.optimizer["lr"] * scale
        return [{"params": head}, {"params": list(backbone.parameters()), "lr": lr}]

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = instantiate(self.hparams.optimizer)(params=self.parameter_groups())
        if not self.hparams.scheduler:
            return {"optimizer": optimizer}
        config = dict(self.hparams.scheduler)
        # Lightning's settings ride along in the config; the rest builds the scheduler.
        settings = {k: config.pop(k) for k in ("interval", "frequency", "monitor") if k in config}
        scheduler = instantiate(config)(optimizer=optimizer)
        if isinstance(scheduler, ReduceLROnPlateau) and not settings.get("monitor"):
            raise UserError(
                "model.scheduler: ReduceLROnPlateau steps on a logged metric, and "
                "model.scheduler.monitor is not set. Add +model.scheduler.monitor=val/loss "
                "(or another metric the run logs)."
            )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, **settings}}
