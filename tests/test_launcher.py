"""Sweeps (`-m`) run every job in a fresh process (hydra_plugins/litforge/subprocess_launcher.py):
DDP jobs in a sweep each get the world size they asked for, and nothing leaks between them."""

import json
import re

import pytest
from helpers import free_port, run_script, tiny_run_args


@pytest.mark.slow
def test_ddp_sweep_gives_each_job_its_own_world_and_folder(tmp_path, idx_data_dir):
    sweep_dir, log_dir = tmp_path / "sweep", tmp_path / "logs"
    args = [a for a in tiny_run_args(idx_data_dir, tmp_path / "unused") if "hydra.run" not in a]
    result = run_script(
        "train.py",
        "-m",
        *args,
        "strategy=ddp",
        "trainer.devices=2",
        "model=mlp,cnn",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        f"hydra.sweep.dir={sweep_dir}",
        f"paths.log_dir={log_dir}",
        env={"MASTER_PORT": str(free_port())},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert sorted(p.name for p in sweep_dir.iterdir()) == ["0", "1", "multirun.yaml"]
    assert not log_dir.exists(), "a rank re-running the sweep would write here"
    output = result.stdout + result.stderr
    # every job trained with the 2 processes it asked for
    assert len(re.findall(r"x 2 data-parallel process\(es\)", output)) == 2
    for job in ("0", "1"):
        files = {p.name for p in (sweep_dir / job).iterdir()}
        assert {".hydra", "metrics.json", "train.log", "train_ddp_process_1.log"} <= files
        assert "test/acc" in json.loads((sweep_dir / job / "metrics.json").read_text())


@pytest.mark.slow
def test_failed_job_is_reported_after_the_others_ran(tmp_path, idx_data_dir):
    sweep_dir = tmp_path / "sweep"
    args = [a for a in tiny_run_args(idx_data_dir, tmp_path / "unused") if "hydra.run" not in a]
    result = run_script(
        "train.py",
        "-m",
        *args,
        "data.val_size=100,100000",
        "trainer.limit_train_batches=2",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert result.returncode == 1
    assert "data.val_size=100000 must be at least 0" in result.stderr
    assert "Traceback" not in result.stderr
    assert "error: 1 job(s) of the sweep failed:" in result.stderr
    assert re.search(r"job #1 \(.*data.val_size=100000.*\) exited with status 1", result.stderr)
    assert (sweep_dir / "0" / "metrics.json").is_file()
