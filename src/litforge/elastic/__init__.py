"""Elastic restarts: jobs that torchrun (--max-restarts) or SLURM (requeue) run again after a
failure or a time limit (`callbacks.restarts`). A feature folder: it imports the core, nothing
in the core imports it (docs/elastic.md)."""

from litforge.elastic.restarts import Restarts

__all__ = ["Restarts"]
