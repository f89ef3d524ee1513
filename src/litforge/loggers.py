"""Loggers of our own, where Lightning's need a change."""

import csv
import logging
import netrc
import os
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger as _LightningCSVLogger
from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger

log = logging.getLogger(__name__)


def wandb_has_credentials() -> bool:
    """An API key in the environment or from `wandb login` (~/.netrc)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return any("wandb" in host for host in netrc.netrc().hosts)
    except (OSError, netrc.NetrcParseError):
        return False


class WandbLogger(_LightningWandbLogger):
    """Never waits for a login: offline without credentials (or `WANDB_MODE=offline`), naming the
    `wandb sync` command. A resumed run (`resume_from`) goes on in its folder's newest wandb run."""

    def __init__(
        self, offline: bool | None = None, resume_from: str | None = None, **kwargs: Any
    ) -> None:
        if offline is None:
            offline = os.environ.get("WANDB_MODE") == "offline" or not wandb_has_credentials()
        save_dir = kwargs.get("save_dir") or "."
        if resume_from and not kwargs.get("id"):  # wandb's folders: `[offline-]run-<time>-<id>`
            runs = sorted(
                Path(save_dir, "wandb").glob("*run-*-*"), key=lambda p: p.name.split("run-", 1)[1]
            )
            if runs:
                kwargs |= {"id": runs[-1].name.rsplit("-", 1)[1], "resume": "allow"}
        super().__init__(offline=offline, **kwargs)
        if offline:
            log.info(
                f"wandb: no API key, logging offline into {save_dir}/wandb; upload later with "
                f"`wandb sync {save_dir}/wandb/offline-run-*`"
            )


class CSVLogger(_LightningCSVLogger):
    """A resumed run (`resume_from`: its ckpt_path) appends to its folder's metrics.csv, which
    Lightning's deletes (by design since 2.2.1: Lightning #19446)."""

    def __init__(self, *args: Any, resume_from: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._resume_from = resume_from

    @property
    @rank_zero_experiment  # only rank 0 reads and rewrites metrics.csv (the others raced it)
    def experiment(self):
        if self._experiment is not None:
            return self._experiment
        metrics_file = Path(self.log_dir) / "metrics.csv"
        kept = None
        if self._resume_from and metrics_file.is_file():
            with metrics_file.open(newline="") as f:
                kept = list(csv.DictReader(f))
        experiment = super().experiment  # deletes metrics.csv
        if kept:
            experiment.metrics_keys = sorted(set().union(*kept))
            with metrics_file.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=experiment.metrics_keys)
                writer.writeheader()
                writer.writerows(kept)
        return experiment
