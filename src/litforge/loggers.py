"""Loggers of our own, where Lightning's need a change (a feature folder may add its own)."""

import csv
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch.loggers
from lightning.fabric.loggers.logger import rank_zero_experiment


class CSVLogger(lightning.pytorch.loggers.CSVLogger):
    """A resumed run (`resume_from`: its ckpt_path) appends to its folder's metrics.csv, which
    Lightning's deletes (by design since 2.2.1: Lightning #19446)."""

    def __init__(self, *args: Any, resume_from: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._resume_from = resume_from
        self._started = False

    @property
    @rank_zero_experiment  # only rank 0 reads and rewrites metrics.csv (the others raced it)
    def experiment(self):
        if self._started:
            return super().experiment
        self._started = True
        metrics_file = Path(self.log_dir) / "metrics.csv"
        kept = None
        if self._resume_from and metrics_file.is_file():
            with metrics_file.open(newline="") as f:
                kept = list(csv.DictReader(f))
        with warnings.catch_warnings():
            if kept:  # Lightning says they will be deleted: they are written back below
                warnings.filterwarnings("ignore", "Experiment logs directory .* is not empty")
            experiment = super().experiment  # deletes metrics.csv
        if kept:
            experiment.metrics_keys = sorted(set().union(*kept))
            with metrics_file.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=experiment.metrics_keys)
                writer.writeheader()
                writer.writerows(kept)
        return experiment
