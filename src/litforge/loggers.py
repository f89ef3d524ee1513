"""Loggers of our own, where Lightning's need a change."""

import csv
import logging
import netrc
import os
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.pytorch.loggers import CSVLogger as _LightningCSVLogger
from lightning.pytorch.loggers import MLFlowLogger as _LightningMLFlowLogger
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


class MLFlowLogger(_LightningMLFlowLogger):
    """Lightning's, named after the run folder (or `run_name`), which also sends the run's files
    at its end (`log_run_files`: metrics.json, the plots, the best checkpoint if asked for). A
    local SQLite store keeps its artifacts beside it. A resumed run (`resume_from`) goes on in
    its MLflow run, whose id the run folder keeps (`mlflow_run_id`)."""

    def __init__(
        self,
        run_dir: str,
        tracking_uri: str,
        tags: list[str] | None = None,
        log_best_checkpoint: bool = False,
        resume_from: str | None = None,
        **kwargs: Any,
    ) -> None:
        self._id_file = Path(run_dir) / "mlflow_run_id"
        self.log_best_checkpoint = log_best_checkpoint
        if tracking_uri.startswith("sqlite:///"):  # the folder must exist; artifacts beside it
            database = Path(tracking_uri.removeprefix("sqlite:///"))
            database.parent.mkdir(parents=True, exist_ok=True)
            kwargs.setdefault("artifact_location", str(database.parent / "mlartifacts"))
        self._resumed = bool(resume_from and self._id_file.is_file())
        if self._resumed:
            kwargs.setdefault("run_id", self._id_file.read_text().strip())
        folder = Path(run_dir)  # <date>_<time>, or a sweep job's <sweep>/<number>
        name = f"{folder.parent.name}/{folder.name}" if folder.name.isdigit() else folder.name
        kwargs["run_name"] = kwargs.get("run_name") or name
        tag_values = {"tags": ",".join(tags)} if tags else None
        super().__init__(tracking_uri=tracking_uri, tags=tag_values, **kwargs)

    @property
    @rank_zero_experiment
    def experiment(self):
        starting = not self._initialized
        client = super().experiment
        if starting:
            self._id_file.parent.mkdir(parents=True, exist_ok=True)
            self._id_file.write_text(f"{self.run_id}\n")
        return client

    def log_hyperparams(self, params: Any) -> None:
        """MLflow keeps a parameter's first value: a resumed run adds the parameters it lacks."""
        if self._resumed:
            logged = self.experiment.get_run(self.run_id).data.params
            flat = _flatten_dict(_convert_params(params))
            params = {k: v for k, v in flat.items() if k not in logged}
        super().log_hyperparams(params)

    def log_run_files(self, run_dir: Path, best_checkpoint: str | None) -> None:
        """Called by the pipeline once the run's metrics.json is written (rank 0)."""
        files = [run_dir / "metrics.json", *sorted((run_dir / "plots").glob("*.png"))]
        for path in files:
            if path.is_file():
                folder = path.parent.name if path.parent != run_dir else None
                self.experiment.log_artifact(self.run_id, str(path), folder)
        if self.log_best_checkpoint and best_checkpoint and Path(best_checkpoint).is_file():
            self.experiment.log_artifact(self.run_id, best_checkpoint, "checkpoints")
