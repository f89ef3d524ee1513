"""`logger=mlflow`: Lightning's MLFlowLogger, into a local SQLite store by default, with the
run's files and resumable."""

from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.pytorch.loggers import MLFlowLogger as _LightningMLFlowLogger

from litforge.errors import UserError
from litforge.hooks import LogsRunFiles


class MLFlowLogger(LogsRunFiles, _LightningMLFlowLogger):
    """Lightning's, named after the run folder (or `run_name`), which also sends the run's files
    at its end (`log_run_files`: metrics.json, any pictures in plots/, the best checkpoint if
    asked for). A local SQLite store keeps its artifacts beside it. A resumed run (`resume_from`)
    goes on in its MLflow run, whose id the run folder keeps (`mlflow_run_id`)."""

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
        try:
            client = super().experiment
        except Exception as err:  # MlflowException: a server not there, a store it can't open
            if not starting:
                raise
            reason = str(err).splitlines()[0][:200]
            raise UserError(
                f"logger=mlflow: tracking at {self._tracking_uri} failed ({reason}). Start the "
                f"server or fix logger.mlflow.tracking_uri / MLFLOW_TRACKING_URI (unset: "
                f"logs/mlflow.db)."
            ) from err
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
