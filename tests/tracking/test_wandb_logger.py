"""`logger=wandb` (litforge.tracking.wandb_logger.WandbLogger) never waits for a login or the
network."""

import os

import pytest
from helpers import compose_config, offline_env, run_script, tiny_run_args

pytest.importorskip("wandb", reason="wandb: pip install -e '.[wandb]'")

from litforge.tracking.wandb_logger import WandbLogger  # noqa: E402


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc from `wandb login`


def test_offline_without_credentials_online_with_a_key(tmp_path, no_credentials, monkeypatch):
    assert WandbLogger(project="p", save_dir=str(tmp_path))._offline is True
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert WandbLogger(project="p", save_dir=str(tmp_path))._offline is False


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


def test_resumed_run_goes_on_in_its_wandb_run(tmp_path, no_credentials):
    (tmp_path / "wandb" / "offline-run-20261122_101500-abc123").mkdir(parents=True)
    (tmp_path / "wandb" / "run-20261122_111500-def456").mkdir()  # the newer
    resumed = WandbLogger(project="p", save_dir=str(tmp_path), resume_from="last")
    assert resumed._wandb_init["id"] == "def456" and resumed._wandb_init["resume"] == "allow"
    fresh = WandbLogger(project="p", save_dir=str(tmp_path))
    assert fresh._wandb_init.get("id") is None


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
    assert list(offline_run.glob("files/media/images/confusion_matrix*.png"))  # feature: plots
    assert os.path.isfile(run_dir / "metrics.json")
