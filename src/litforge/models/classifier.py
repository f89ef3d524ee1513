"""The LightningModule: trains any backbone network on a classification task."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torchmetrics import MaxMetric, MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score


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

    Logged: `{train,val,test}/loss`, `/acc`, `val|test/f1` (macro), `val/acc_best`.
    """

    def __init__(
        self,
        net: Mapping[str, Any],
        input_shape: Sequence[int],
        num_classes: int,
        optimizer: Mapping[str, Any],
        scheduler: Mapping[str, Any] | None = None,
        class_names: Sequence[str] | None = None,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(
            {
                "net": _plain(net),
                "input_shape": list(input_shape),
                "num_classes": int(num_classes),
                "optimizer": _plain(optimizer),
                "scheduler": _plain(scheduler),
                "class_names": list(class_names) if class_names is not None else None,
            },
            logger=False,  # the pipeline logs the whole resolved run config instead
        )
        # How to run the network, not what it is: kept out of the checkpoint, so that a
        # checkpoint from a compiled run loads into an eager one and the other way round.
        self.compile_net = compile
        self.net = instantiate(self.hparams.net, input_shape=input_shape, num_classes=num_classes)

        def metrics(prefix: str) -> MetricCollection:
            return MetricCollection(
                {
                    "acc": MulticlassAccuracy(num_classes, average="micro"),
                    "f1": MulticlassF1Score(num_classes, average="macro"),
                },
                prefix=prefix,
            )

        # Validation and test use TorchMetrics (synced across processes). Training accuracy is a
        # plain per-batch mean: a metric object updated every step would cost ~0.8 ms per step.
        self.val_metrics = metrics("val/")
        self.test_metrics = metrics("test/")
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # part of the checkpoint, so a resumed run keeps it

    def configure_model(self) -> None:
        # Lightning calls this once the strategy is set up. `nn.Module.compile` compiles in
        # place, so parameter names and state_dict keys stay free of torch.compile's
        # `_orig_mod.` prefix.
        if self.compile_net and not getattr(self.net, "_compiled_call_impl", None):
            self.net.compile()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        # Epoch means weighted by batch size; sync_dist reduces them across processes once, at
        # the end of the epoch.
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log("train/acc", acc, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True)
        return loss

    def _evaluate(self, batch, metrics: MetricCollection, loss_metric: MeanMetric, prefix: str):
        x, y = batch
        logits = self(x)
        loss_metric.update(F.cross_entropy(logits, y), weight=len(y))
        metrics.update(logits, y)
        self.log(f"{prefix}/loss", loss_metric, on_step=False, on_epoch=True, prog_bar=True)
        self.log_dict(metrics, on_step=False, on_epoch=True, prog_bar=True)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics, self.val_loss, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics, self.test_loss, "test")

    def on_train_start(self) -> None:
        # The sanity check ran validation on untrained weights: don't let it count as a best.
        self.val_acc_best.reset()

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            return
        self.val_acc_best.update(self.val_metrics["acc"].compute())
        self.log("val/acc_best", self.val_acc_best.compute(), prog_bar=True)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = instantiate(self.hparams.optimizer)(params=self.parameters())
        if not self.hparams.scheduler:
            return {"optimizer": optimizer}
        scheduler_cfg = dict(self.hparams.scheduler)
        # Lightning's scheduler settings ride along in the same config; the rest builds it.
        lightning_keys = {
            k: scheduler_cfg.pop(k)
            for k in ("interval", "frequency", "monitor")
            if k in scheduler_cfg
        }
        scheduler = instantiate(scheduler_cfg)(optimizer=optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, **lightning_keys}}
