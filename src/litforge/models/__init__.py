"""Networks (plain `nn.Module`s) and the LightningModule that trains them.

A checkpoint stores its network, optimizer and scheduler configs, built again when it loads: it
is data, so what it (and a training config) may build is registered here, anything else refused.
A name matches exactly: the name listed, or where that class is defined
(`torch.optim.adamw.AdamW` is `torch.optim.AdamW`), never a name that merely starts like one.

- `NETWORKS`: what `model.net._target_` may name. **Add your own network here.**
- `OPTIMIZERS`: what `model.optimizer._target_` and `model.scheduler._target_` may name: every
  optimizer and learning-rate scheduler class of `torch.optim`. Add others here.
- `MODULES`: the LightningModules `eval.py`, predict, export and serve build from a checkpoint.
"""

import torch.optim
from torch.optim import lr_scheduler


def _classes(module, base: type | tuple[type, ...], prefix: str) -> tuple[str, ...]:
    """The public subclasses of `base` that `module` exports (not `base` itself)."""
    return tuple(
        f"{prefix}.{name}"
        for name in module.__all__
        if isinstance(cls := getattr(module, name), type)
        and issubclass(cls, base)
        and cls not in (torch.optim.Optimizer, lr_scheduler.LRScheduler)
    )


NETWORKS = (
    "litforge.models.mlp.MLP",
    "litforge.models.cnn.CNN",
    "litforge.backbones.timm.TimmNet",  # feature: backbones
)
OPTIMIZERS = (
    *_classes(torch.optim, torch.optim.Optimizer, "torch.optim"),
    *_classes(lr_scheduler, lr_scheduler.LRScheduler, "torch.optim.lr_scheduler"),
)

from litforge.models.classifier import ClassificationModule  # noqa: E402 (it reads the lists)

MODULES = (ClassificationModule,)

__all__ = ["MODULES", "NETWORKS", "OPTIMIZERS", "ClassificationModule"]
