"""Networks (plain `nn.Module`s) and the LightningModule that trains them. What a checkpoint may
build is decided by where a class is defined (`litforge.checkpoints.trusted_class`), not by a
list here: a network or optimizer of this project's packages loads as it trains."""

from litforge.models.classifier import ClassificationModule

__all__ = ["ClassificationModule"]
