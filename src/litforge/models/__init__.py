"""Networks (plain `nn.Module`s) and the LightningModule that trains them.

A checkpoint stores its network, optimizer and scheduler configs, built again when it loads: it
is data, so what it may build is registered here, anything else refused. (A training config is
yours, and builds whatever it names.)
A name matches exactly: the name listed, or where that class is defined
(`torch.optim.adamw.AdamW` is `torch.optim.AdamW`), never a name that merely starts like one.

- `NETWORKS`: what `model.net._target_` may name. **Add your own network here.**
- `OPTIMIZERS`, `SCHEDULERS`: what `model.optimizer._target_` and `model.scheduler._target_` may
  name: every optimizer and learning-rate scheduler class of `torch.optim`. Add others here.
- `MODULES`: the LightningModules that `eval.py` (and any other loader) builds from a checkpoint.
"""

import torch.optim
from torch.optim import lr_scheduler


def _public_subclasses(module, base: type) -> tuple[str, ...]:
    """`<module>.<name>` of each class `module` exports that subclasses `base` (not `base`)."""
    return tuple(
        f"{module.__name__}.{name}"
        for name in module.__all__
        if isinstance(cls := getattr(module, name), type)
        and issubclass(cls, base)
        and cls is not base
    )


NETWORKS = (
    "litforge.models.mlp.MLP",
    "litforge.models.cnn.CNN",
    "litforge.backbones.timm.TimmNet",  # feature: backbones
)
OPTIMIZERS = _public_subclasses(torch.optim, torch.optim.Optimizer)
SCHEDULERS = _public_subclasses(lr_scheduler, lr_scheduler.LRScheduler)

from litforge.models.classifier import ClassificationModule  # noqa: E402 (it imports this module)

MODULES = (ClassificationModule,)

__all__ = ["MODULES", "NETWORKS", "OPTIMIZERS", "SCHEDULERS", "ClassificationModule"]
