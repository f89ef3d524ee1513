"""`logger=`: wandb (litforge.loggers.WandbLogger) never waits for a login or the network;
tensorboard records the model graph when asked; mlflow keeps the run in a local SQLite store,
read back here through MlflowClient."""

import importlib.util
import os

import pytest
from helpers import compose_config, offline_env, run_script, tiny_run_args

from litforge.loggers import WandbLogger
from litforge.pipeline import train

needs = {
    name: pytest.mark.skipif(
        importlib.util.find_spec(name) is None, reason=f"{name}: pip install -e '.[loggers]'"
    )
    for name in ("wandb", "tensorboard")
}
needs["mlflow"] = pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None, reason="mlflow: pip install -e '.[mlflow]'"
)


@needs["tensorboard"]
@pytest.mark.parametrize("log_graph", [False, True])
def test_tensorboard_records_the_graph_when_asked(tmp_path, idx_data_dir, log_graph):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides = ["data=mnist", "data.val_size=100", "trainer.max_epochs=1"]
    overrides += ["logger=tensorboard", f"logger.tensorboard.log_graph={log_graph}"]
    train(compose_config("train", tmp_path, overrides))
    graphs = []
    for events in (tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        if accumulator.Tags()["graph"]:
            graphs.append({node.name.split("/")[0] for node in accumulator.Graph().node})
    if log_graph:  # Lightning records it when fitting and again when testing
        assert graphs and all(g == {"input", "output", "ClassificationModule"} for g in graphs)
    else:
        assert graphs == []


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc from `wandb login`


@needs["wandb"]
def test_offline_without_credentials_online_with_a_key(tmp_path, no_credentials, monkeypatch):
    assert WandbLogger(project="p", save_dir=str(tmp_path))._offline is True
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert WandbLogger(project="p", save_dir=str(tmp_path))._offline is False


@needs["wandb"]
def test_jobs_of_a_sweep_share_a_group(tmp_path, no_credentials):
    # The launcher gives each job of a sweep `++sweep_name=<the sweep folder's name>`.
    from hydra.utils import instantiate

    job = compose_config("train", tmp_path, ["logger=wandb", "++sweep_name=2026-11-22_10-00-00"])
    logger = instantiate(job.logger.wandb)
    assert logger._wandb_init["group"] == "2026-11-22_10-00-00"
    single = compose_config("train", tmp_path, ["logger=wandb"])
    assert instantiate(single.logger.wandb)._wandb_init.get("group") is None
    own = ["logger=wandb", "++sweep_name=s", "logger.wandb.group=mine"]  # the user's choice wins
    logger = instantiate(compose_config("train", tmp_path, own).logger.wandb)
    assert logger._wandb_init["group"] == "mine"


@needs["wandb"]
def test_resumed_run_goes_on_in_its_wandb_run(tmp_path, no_credentials):
    (tmp_path / "wandb" / "offline-run-20261122_101500-abc123").mkdir(parents=True)
    (tmp_path / "wandb" / "run-20261122_111500-def456").mkdir()  # the newer
    resumed = WandbLogger(project="p", save_dir=str(tmp_path), resume_from="last")
    assert resumed._wandb_init["id"] == "def456" and resumed._wandb_init["resume"] == "allow"
    fresh = WandbLogger(project="p", save_dir=str(tmp_path))
    assert fresh._wandb_init.get("id") is None


@needs["wandb"]
@pytest.mark.slow
def test_run_logs_offline_with_the_network_blocked(tmp_path, idx_data_dir):
    run_dir = tmp_path / "run"
    env = {**offline_env(tmp_path), "HOME": str(tmp_path), "WANDB_API_KEY": "", "WANDB_MODE": ""}
    args = tiny_run_args(idx_data_dir, run_dir, "logger=wandb", "trainer.limit_train_batches=2")
    result = run_script("train.py", *args, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert f"logging offline into {run_dir}/wandb; upload later with `wandb sync" in output
    (offline_run,) = (run_dir / "wandb").glob("offline-run-*")
    # The run's records (config included) sit in its .wandb file until `wandb sync`: the
    # resolved run config went in, with no `${...}` interpolations left.
    (records,) = offline_run.glob("run-*.wandb")
    data = records.read_bytes()
    assert b"max_epochs" in data and b"MNISTDataModule" in data and b"${" not in data
    # the plots went along as images
    assert list((offline_run / "files" / "media" / "images").glob("confusion_matrix*.png"))
    assert os.path.isfile(run_dir / "metrics.json")


def test_a_resumed_csv_log_is_rewritten_by_rank_zero_only(tmp_path, monkeypatch):
    """Other processes of a resumed job leave metrics.csv alone: two rewriting it at once lost
    the kept rows' columns (seen in a requeued SLURM job)."""
    from lightning.pytorch.utilities import rank_zero_only

    from litforge.loggers import CSVLogger

    metrics = tmp_path / "csv" / "metrics.csv"
    metrics.parent.mkdir()
    metrics.write_text("epoch,step,val/acc\n0,9,0.5\n")
    before = metrics.stat().st_mtime_ns
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger = CSVLogger(tmp_path, name="csv", version="", resume_from="last.ckpt")
    logger.experiment  # noqa: B018 (what Lightning touches first)
    assert metrics.read_text() == "epoch,step,val/acc\n0,9,0.5\n"
    assert metrics.stat().st_mtime_ns == before
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    assert CSVLogger(tmp_path, name="csv", version="", resume_from="x").experiment.metrics_keys


@needs["mlflow"]
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
    assert {"metrics.json", "plots/curves.png", "plots/confusion_matrix.png"} <= files
    assert any(f.startswith("checkpoints/") and f.endswith(".ckpt") for f in files)
    assert (tmp_path / "logs" / "mlartifacts").is_dir()  # beside the database, not ./mlruns

    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    train(
        compose_config("train", tmp_path, [*overrides, "trainer.max_epochs=3", f"ckpt_path={last}"])
    )
    (resumed,) = client.search_runs([experiment.experiment_id])  # the same run, gone on
    assert [m.step for m in client.get_metric_history(resumed.info.run_id, "val/acc")] == [1, 3, 5]
