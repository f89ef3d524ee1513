"""Networks (plain `nn.Module`s) and the LightningModule that trains them."""

from litforge.models.classifier import ClassificationModule

__all__ = ["ClassificationModule"]
