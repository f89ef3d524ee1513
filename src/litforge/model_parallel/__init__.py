"""Model parallelism: FSDP2, tensor and pipeline parallelism (`strategy=model_parallel`), and the
folders of shards its checkpoints are (`shards.py`; `python -m litforge.model_parallel to-file`
puts one together into one checkpoint file). A feature folder: it imports the core, nothing in the
core imports it (docs/model_parallel.md)."""

from litforge.model_parallel.strategy import ModelParallelStrategy

__all__ = ["ModelParallelStrategy"]
