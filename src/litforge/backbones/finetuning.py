"""Fine-tuning: the backbone frozen while a new head learns; an average of the weights."""

import logging
import warnings
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EMAWeightAveraging as _LightningEMA
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn

from litforge.errors import UserError
from litforge.settings import NonNegativeInt

log = logging.getLogger(__name__)

# Lightning warns that WeightAveraging cannot shard layers that configure_model creates; the
# module's configure_model creates none (it sets the weights' layout, or compiles).
warnings.filterwarnings("ignore", message="You're using the WeightAveraging callback with a model")


class FreezeBackbone(L.Callback):
    """The network's `backbone` learns nothing for the first `epochs` epochs, so that a new,
    randomly initialized head does not disturb pretrained weights with its first large
    gradients; then it trains with the rest.

    Lightning's BackboneFinetuning sets `requires_grad=False` instead, which under DDP leaves the
    frozen parameters out of gradient synchronization for good (DDP is set up while they are
    frozen). Here every parameter keeps its gradient, and the backbone's are dropped before each
    optimizer step while frozen: an optimizer leaves a parameter without a gradient alone (no
    step, no weight decay, no state). Whether to freeze follows from the epoch alone, so it is the
    same on every process and after a resume. Batch-norm statistics still follow the new data."""

    def __init__(self, epochs: NonNegativeInt = 1) -> None:
        self.epochs = epochs
        self._said: str | None = None  # "frozen" or "unfrozen": each said once

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = "frozen" if trainer.current_epoch < self.epochs else "unfrozen"
        if state == self._said or not trainer.is_global_zero:
            return
        if state == "frozen":
            log.info(
                f"Backbone frozen for epoch(s) {trainer.current_epoch} to {self.epochs - 1} "
                f"(callbacks.freeze_backbone.epochs={self.epochs}): only the head learns."
            )
        elif self._said == "frozen":  # not on resuming a run that was past it
            scale = pl_module.hparams.get("backbone_lr_scale", 1.0)
            log.info(
                f"Backbone unfrozen at epoch {trainer.current_epoch}: it learns from now on, "
                f"at {scale} x the head's learning rate (model.backbone_lr_scale)."
            )
        self._said = state

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        net = getattr(pl_module, "net", None)
        if stage == "fit" and not isinstance(getattr(net, "backbone", None), nn.Module):
            raise UserError(
                f"callbacks.freeze_backbone: {type(net).__name__} has no `backbone` to freeze: "
                f"use a network with one (model=timm), or leave freeze_backbone out of callbacks."
            )

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: Any, optimizer) -> None:
        if trainer.current_epoch < self.epochs:
            for parameter in pl_module.net.backbone.parameters():
                parameter.grad = None


class EMAWeightAveraging(_LightningEMA):
    """Lightning's EMAWeightAveraging: validation and checkpoints get the average of the weights,
    training goes on from the current ones. But a checkpoint tested after training (train.py
    tests the best one) is tested with the average it holds, as eval.py tests it: Lightning's
    would load the current weights back into the module for `trainer.test` too."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        when = ""
        if self.update_starting_at_step is not None:
            when = f" from step {self.update_starting_at_step}"
        elif self.update_starting_at_epoch is not None:
            when = f" from epoch {self.update_starting_at_epoch}"
        if trainer.is_global_zero:
            log.info(
                f"EMA weights in use{when} (callbacks.ema): validation, checkpoints and the test "
                f"use a moving average of the weights; training goes on from the current ones."
            )

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        if trainer.state.fn == TrainerFn.FITTING:  # resuming: both the average and the current
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
