"""Networks (plain `nn.Module`s) and the LightningModule that trains them.

A checkpoint stores the configs of its network, optimizer and scheduler, built again when it
loads: it is data, so what it may build is listed here and anything else is refused (in the
configs you train with too):

- `NETWORKS`: what `model.net._target_` may name. **Add your own network here.**
- `OPTIMIZERS`: the module prefixes of what `model.optimizer._target_` and
  `model.scheduler._target_` may name.
"""

NETWORKS = (
    "litforge.models.mlp.MLP",
    "litforge.models.cnn.CNN",
)
OPTIMIZERS = ("torch.optim.",)  # torch's optimizers and learning-rate schedulers

from litforge.models.classifier import ClassificationModule  # noqa: E402 (it reads the lists)

__all__ = ["NETWORKS", "OPTIMIZERS", "ClassificationModule"]
