"""Sweeps (`-m`) run every job in a fresh process (hydra_plugins/litforge/subprocess_launcher.py):
DDP jobs in a sweep each get the world size they asked for, and nothing leaks between them."""

import csv
import json
import re

import pytest
import yaml
from helpers import CONF, free_port, run_in_process, run_script, tiny_run_args


@pytest.mark.slow
def test_ddp_sweep_gives_each_job_its_own_world_and_folder(tmp_path, idx_data_dir):
    sweep_dir, log_dir = tmp_path / "sweep", tmp_path / "logs"
    args = tiny_run_args(idx_data_dir, None)
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
    assert sorted(p.name for p in sweep_dir.iterdir()) == [
        "0",
        "1",
        "multirun.yaml",
        "plots",
        "summary.csv",
        "summary.md",
    ]
    assert not log_dir.exists(), "a rank re-running the sweep would write here"
    output = result.stdout + result.stderr
    # every job trained with the 2 processes it asked for
    assert len(re.findall(r"x 2 data-parallel process\(es\)", output)) == 2
    for job in ("0", "1"):
        files = {p.name for p in (sweep_dir / job).iterdir()}
        assert {".hydra", "metrics.json", "train.log", "train_ddp_process_1.log"} <= files
        assert "test/acc" in json.loads((sweep_dir / job / "metrics.json").read_text())


@pytest.mark.slow
def test_sweep_summary_has_failed_rows_and_seed_means(tmp_path, idx_data_dir):
    sweep_dir = tmp_path / "sweep"
    args = tiny_run_args(idx_data_dir, None)
    result = run_script(
        "train.py",
        "-m",
        *args,
        "seed=0,1",
        "data.val_size=100,100000",
        "trainer.limit_train_batches=2",
        f"hydra.sweep.dir={sweep_dir}",
    )
    # the failing jobs do not stop the others; the sweep says so at the end and exits 1
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "error: 2 job(s) of the sweep failed:" in result.stderr
    assert re.search(
        r"#\d \(.*data.val_size=100000.*\): data.val_size=100000 must be below", result.stderr
    )

    with (sweep_dir / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["completed"] * 2 + ["failed"] * 2 + ["completed"]
    assert rows[4]["job"] == "mean ± std"
    completed, failed, mean = rows[:2], rows[2:4], rows[4]
    assert [float(r["val/acc_best"]) for r in completed] == sorted(
        (float(r["val/acc_best"]) for r in completed), reverse=True
    )
    assert all(r["status"] == "failed" for r in failed)
    assert all("val_size=100000 must be below the 60000" in r["error"] for r in failed)
    assert {frozenset(r["overrides"].split()) for r in failed} == {
        frozenset({"seed=0", "data.val_size=100000"}),
        frozenset({"seed=1", "data.val_size=100000"}),
    }
    assert mean["overrides"] == "data.val_size=100 (2 seeds)" and " ± " in mean["test/acc"]
    assert (sweep_dir / "summary.md").read_text().count("\n") == 2 + 5
    assert (sweep_dir / "plots" / "sweep.png").read_bytes().startswith(b"\x89PNG")


ENTRY_POINT = """
import sys

import hydra

from litforge.runs import register_resolvers

register_resolvers()  # the resolvers conf/ uses, as every entry point of conf/ does


@hydra.main(config_path="{conf}", config_name="train", version_base="1.3")
def main(cfg):
    if cfg.seed == 1:
        sys.exit(3)


main()
"""


@pytest.mark.slow
def test_an_entry_point_of_your_own_fails_the_sweep_when_a_job_fails(tmp_path):
    # Nothing but @hydra.main (and conf/'s resolvers): the sweep summary callback of conf/hydra/
    # sets the exit status.
    script = tmp_path / "my_entry.py"
    script.write_text(ENTRY_POINT.format(conf=CONF))
    sweep_dir = tmp_path / "sweep"
    result = run_script(str(script), "-m", "seed=0,1", f"hydra.sweep.dir={sweep_dir}")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "error: 1 job(s) of the sweep failed:" in result.stderr
    assert "#1 (seed=1): exited with status 3" in result.stderr
    # Each job knows its sweep from an override (no environment variable), before the sweep's.
    for job in ("0", "1"):
        hydra_dir = sweep_dir / job / ".hydra"
        overrides = yaml.safe_load((hydra_dir / "overrides.yaml").read_text())
        assert overrides == ["++sweep_name='sweep'", f"seed={job}"]
        assert yaml.safe_load((hydra_dir / "config.yaml").read_text())["sweep_name"] == "sweep"
    with (sweep_dir / "summary.csv").open() as f:
        assert [(r["job"], r["status"]) for r in csv.DictReader(f)] == [
            ("0", "completed"),
            ("1", "failed"),
        ]


def test_a_sweep_job_keeps_its_folder(tmp_path):
    # The sweep summary lists each failed job with its folder (the subprocess launcher's jobs,
    # which it tells their sweep with `++sweep_name=`).
    run_dir = tmp_path / "sweep" / "0"
    result = run_in_process(
        "train.py", "++sweep_name=sweep", "data.batch_size=0", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 1
    assert (run_dir / "train.log").is_file()
