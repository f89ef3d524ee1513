"""`logger=mlflow` keeps the run in a local SQLite store, read back here through MlflowClient."""

import pytest
from helpers import compose_config, run_in_process, tiny_run_args

from litforge.pipeline import train

pytest.importorskip("mlflow", reason="mlflow: pip install -e '.[mlflow]'")


def test_mlflow_keeps_config_metrics_and_files_in_sqlite_and_resumes(
    tmp_path, idx_data_dir, monkeypatch
):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    overrides = ["data=mnist", "data.val_size=100", f"paths.data_dir={idx_data_dir}"]
    overrides += ["logger=mlflow", "logger.mlflow.log_best_checkpoint=true", "tags=[mnist,x]"]
    metrics = train(compose_config("train", tmp_path, [*overrides, "trainer.max_epochs=2"]))

    database = tmp_path / "logs" / "mlflow.db"  # under paths.log_dir
    client = MlflowClient(f"sqlite:///{database}")
    experiment = client.get_experiment_by_name("train")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"  # the run folder
    params = run.data.params
    assert params["data/_target_"].endswith("MNISTDataModule")
    assert (
        params["trainer/max_epochs"] == "2"
        and params["batch_size/global"] == params["data/batch_size"]
    )
    assert run.data.tags["tags"] == "mnist,x"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/acc")] == [1, 3]
    assert run.data.metrics["test/acc"] == pytest.approx(metrics["test/acc"])
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    files |= {
        a.path
        for folder in ("plots", "checkpoints")
        for a in client.list_artifacts(run.info.run_id, folder)
    }
    assert "metrics.json" in files
    assert {"plots/curves.png", "plots/confusion_matrix.png"} <= files  # feature: plots
    assert any(f.startswith("checkpoints/") and f.endswith(".ckpt") for f in files)
    assert (tmp_path / "logs" / "mlartifacts").is_dir()  # beside the database, not ./mlruns

    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    train(
        compose_config("train", tmp_path, [*overrides, "trainer.max_epochs=3", f"ckpt_path={last}"])
    )
    (resumed,) = client.search_runs([experiment.experiment_id])  # the same run, gone on
    assert [m.step for m in client.get_metric_history(resumed.info.run_id, "val/acc")] == [1, 3, 5]


def test_a_tracking_server_that_is_not_there_is_one_line(tmp_path, idx_data_dir, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's retries take minutes
    args = tiny_run_args(idx_data_dir, tmp_path / "run", "logger=mlflow")
    result = run_in_process("train.py", *args, "logger.mlflow.tracking_uri=http://127.0.0.1:9")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "error: logger=mlflow: tracking at http://127.0.0.1:9 failed" in result.stderr
    assert "fix logger.mlflow.tracking_uri / MLFLOW_TRACKING_URI" in result.stderr
