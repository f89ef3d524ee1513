"""Networks (plain `nn.Module`s) and the LightningModule that trains them.

A checkpoint stores its network, optimizer and scheduler configs, built again when it loads: it
is data, so what it (and a training config) may build is listed here, anything else refused:

- `NETWORKS`: what `model.net._target_` may name. **Add your own network here.**
- `OPTIMIZERS`: module prefixes for `model.optimizer._target_` and `model.scheduler._target_`.
"""

NETWORKS = (
    "litforge.models.mlp.MLP",
    "litforge.models.cnn.CNN",
    "litforge.backbones.timm.TimmNet",  # feature: backbones
)
OPTIMIZERS = ("torch.optim.",)  # torch's optimizers and learning-rate schedulers

from litforge.models.classifier import ClassificationModule  # noqa: E402 (it reads the lists)

__all__ = ["NETWORKS", "OPTIMIZERS", "ClassificationModule"]
