"""The LightningModule that trains any backbone network on a classification task."""

import os
from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torchmetrics import MaxMetric, MeanMetric, MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
)

from litforge import checkpoints
from litforge.errors import UserError
from litforge.settings import Fraction, NonNegative


def plain(config: Any) -> Any:
    """A config as plain dicts and lists, resolved: checkpoints load with weights_only=True."""
    if OmegaConf.is_config(config):
        return OmegaConf.to_container(config, resolve=True)
    return list(config) if isinstance(config, tuple) else config


# Lightning's scheduler settings, which ride along in model.scheduler beside its arguments.
LIGHTNING_SCHEDULER_SETTINGS = ("interval", "frequency", "monitor", "strict", "name")


class ClassificationModule(L.LightningModule):
    """`net`, `optimizer` and `scheduler` are Hydra configs (the latter two `_partial_: true`), kept
    as plain dicts: `load_from_checkpoint(path, weights_only=True)` rebuilds the module without
    Hydra's objects or pickles. Logged: `train/loss_step` (each step), `train/loss` and
    `train/acc` (the epoch's), `{val,test}/loss`, `/acc`, `/f1` (macro), `/acc_balanced` (the
    mean of the per-class recalls), `val/acc_best`.

    A batch, as the datamodule's `on_after_batch_transfer` hands it over (docs/data.md): float32
    images N×C×H×W normalized by the data's mean and std, and int64 class indices N, or, in
    training with `data.mix`, float32 per-class probabilities N×num_classes."""

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
        label_smoothing: Fraction = 0.0,
        backbone_lr_scale: NonNegative = 1.0,
    ) -> None:
        super().__init__()
        net, optimizer, scheduler = (plain(c) for c in (net, optimizer, scheduler))
        self.save_hyperparameters(
            {
                # `pretrained*` settings start the weights; the checkpoint holds them from then on.
                "net": {k: v for k, v in net.items() if not k.startswith("pretrained")},
                "input_shape": plain(input_shape),
                "num_classes": num_classes,
                "optimizer": optimizer,
                "scheduler": scheduler,
                "class_names": plain(class_names),
                "channels_last": channels_last,  # other kernels: computes as in training
                # `data.balance=loss`: the training loss weighs each class by these.
                "class_weights": plain(class_weights),
                # How the data normalized [0, 1] pixels per channel: new images get the same.
                "mean": plain(mean),
                "std": plain(std),
                "label_smoothing": label_smoothing,
                "backbone_lr_scale": backbone_lr_scale,
            },
            logger=False,  # the pipeline logs the whole resolved run config instead
        )
        self.compile_net = compile  # not checkpointed: a compiled run's loads into an eager one
        self.net = instantiate(net, input_shape=tuple(input_shape), num_classes=num_classes)
        weights = torch.tensor(class_weights, dtype=torch.float32) if class_weights else None
        self.register_buffer("class_weights", weights, persistent=False)

        # Epoch means over all processes' samples. No per-batch checks, which wait for the GPU:
        # of labels (validate_args), for NaNs (nan_strategy; it then ignores weights: a batch's
        # mean loss is repeated once per sample instead).
        self.train_loss = MeanMetric(nan_strategy="disable")
        self.train_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        for metric in (self.train_loss, self.train_acc):  # an epoch resumed mid-way goes on
            metric.persistent(True)  # from what it had counted (rank 0's, under DDP)
        metrics = MetricCollection(
            {
                "acc": MulticlassAccuracy(num_classes, average="micro"),
                "f1": MulticlassF1Score(num_classes, average="macro"),
                "acc_balanced": MulticlassAccuracy(num_classes, average="macro"),
            }
        )
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        self.val_loss = MeanMetric(nan_strategy="disable")
        self.test_loss = MeanMetric(nan_strategy="disable")
        self.test_confusion = MulticlassConfusionMatrix(num_classes)  # counts, after test
        self.test_confusion_matrix: torch.Tensor | None = None
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # part of the checkpoint, so a resumed run keeps it

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, *args: Any, **kwargs: Any):
        """Lightning's, once `checkpoints.read` has checked the local file: a checkpoint is data,
        and builds only trusted classes, of the sizes it holds."""
        if not isinstance(checkpoint_path, (str, os.PathLike)) or not os.path.isfile(
            checkpoint_path
        ):
            raise UserError(
                f"load_from_checkpoint: {str(checkpoint_path)[:200]!r} is no local file: the "
                f"checks of what a checkpoint builds read local files. Download it first."
            )
        checkpoint = checkpoints.read(checkpoint_path)
        checkpoints.check_sizes(checkpoint, cls, f"ckpt_path={checkpoint_path}")
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

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
        loss = self.loss(logits, y)
        self.train_loss.update(loss.detach().expand(len(y)))  # (per sample)
        self.train_acc.update(logits, y.argmax(dim=1) if y.ndim > 1 else y)  # (data.mix: blends)
        self.log("train/loss_step", loss, prog_bar=True)
        return loss

    def on_train_epoch_end(self) -> None:
        # The epoch's means over every process's samples (compute() syncs them), logged once: a
        # metric logged in the step costs ~1 ms there on a CPU. (A fork's own step may not count.)
        if self.train_loss.update_called:
            means = {"train/loss": self.train_loss.compute(), "train/acc": self.train_acc.compute()}
            self.log_dict(means, prog_bar=True, sync_dist=True)

    def on_train_start(self) -> None:
        if self.trainer.global_rank > 0:  # each process saved rank 0's sums: counted once
            self.train_loss.reset()
            self.train_acc.reset()

    def on_train_epoch_start(self) -> None:
        # (Not called for an epoch resumed mid-way.) A checkpoint at an epoch's end holds its sums.
        self.train_loss.reset()
        self.train_acc.reset()

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_loss.update(F.cross_entropy(logits, y).expand(len(y)))
        self.val_metrics.update(logits, y)

    def test_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.test_loss.update(F.cross_entropy(logits, y).expand(len(y)))
        self.test_metrics.update(logits, y)
        self.test_confusion.update(logits, y)

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, _ = batch  # (`trainer.predict(model, datamodule)`: the test images)
        return self(x)

    def _log_evaluation(self, metrics: MetricCollection, loss: MeanMetric, prefix: str) -> dict:
        values = {**metrics.compute(), f"{prefix}/loss": loss.compute()}  # synced over processes
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
        in_backbone = {id(p) for p in backbone.parameters()}
        head = [p for p in self.parameters() if id(p) not in in_backbone]
        lr = self.hparams.optimizer["lr"] * scale
        return [{"params": head}, {"params": list(backbone.parameters()), "lr": lr}]

    def configure_optimizers(self) -> dict[str, Any]:
        params = self.parameter_groups()
        try:  # (a TypeError: a setting the class does not take, or of the wrong kind)
            optimizer = instantiate(self.hparams.optimizer)(params=params)
        except TypeError as err:
            raise UserError(f"model.optimizer: {err}") from err
        if not self.hparams.scheduler:
            return {"optimizer": optimizer}
        config = dict(self.hparams.scheduler)
        settings = {k: config.pop(k) for k in LIGHTNING_SCHEDULER_SETTINGS if k in config}
        try:
            scheduler = instantiate(config)(optimizer=optimizer)
        except TypeError as err:
            raise UserError(f"model.scheduler: {err}") from err
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, **settings}}
