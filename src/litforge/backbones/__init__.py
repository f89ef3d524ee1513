"""Pretrained backbones (`model=timm`): any timm model as a network's `backbone` with a head for
the dataset's classes, its weights from a local file, and freezing it while the head learns. A
feature folder: it imports the core, nothing in the core imports it (docs/models.md)."""
