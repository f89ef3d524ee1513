"""Where a run writes (litforge/runs.py) and what a job that a launcher runs again continues
from (`litforge.resume.default_checkpoint`)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SLURM, compose_config, run_in_process

from litforge.errors import UserError
from litforge.resume import default_checkpoint
from litforge.runs import run_dir


@pytest.mark.parametrize(
    ("variables", "default"),
    [
        ({}, None),
        ({"TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_MAX_RESTARTS": "0"}, None),
        ({"TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_MAX_RESTARTS": "3"}, "auto"),
        ({**SLURM, "SLURM_JOB_ID": "12"}, "auto"),
        ({**SLURM, "SLURM_JOB_ID": "12", "SLURM_JOB_NAME": "bash"}, None),  # srun --pty bash
    ],
    ids=["plain", "torchrun", "torchrun-restarts", "slurm", "slurm-interactive"],
)
def test_ckpt_path_is_auto_where_a_launcher_restarts_the_job(
    tmp_path, launched, variables, default
):
    launched(**variables)
    assert default_checkpoint(compose_config("train", tmp_path).ckpt_path) == default


def test_auto_goes_on_in_the_jobs_folder_or_this_commands_unfinished_run(tmp_path, launched):
    runs = tmp_path / "runs"
    for age, (name, overrides, finished) in enumerate(
        [
            ("c", ["model=mlp"], False),  # another command, the newest
            ("b", ["model=cnn"], True),  # newer than a, but done: metrics.json
            ("a", ["model=cnn"], False),
        ]
    ):
        (runs / name / "checkpoints").mkdir(parents=True)
        (runs / name / "checkpoints" / "last.ckpt").write_bytes(b"")
        os.utime(runs / name / "checkpoints" / "last.ckpt", (1e9 - age, 1e9 - age))
        (runs / name / ".hydra").mkdir()
        (runs / name / ".hydra" / "overrides.yaml").write_text(
            "".join(f"- {o}\n" for o in overrides)
        )
        if finished:
            (runs / name / "metrics.json").write_text("{}")
    assert run_dir(str(runs), "auto", ["model=cnn"]) == str(runs / "a")
    fresh = run_dir(str(runs), "auto", ["model=cnn", "seed=3"])
    assert Path(fresh).parent == runs and Path(fresh).name not in "abc"

    launched(TORCHELASTIC_RUN_ID="job7", TORCHELASTIC_MAX_RESTARTS="1")
    assert run_dir(str(runs), "auto", ["model=cnn"]) == str(runs / "torchrun-job7")


@pytest.mark.slow  # two interpreters that import Lightning
def test_torchrun_restarts_without_a_rendezvous_id(tmp_path, launched):
    # One machine: the restarted workers share their agent (here: this process), which names
    # the folder.
    launched(TORCHELASTIC_RUN_ID="none", TORCHELASTIC_MAX_RESTARTS="1")
    worker = "from litforge.runs import run_dir; import sys; print(run_dir(sys.argv[1], 'auto'))"
    folders = {
        subprocess.run(
            [sys.executable, "-c", worker, str(tmp_path)], capture_output=True, text=True
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(folders) == 1 and folders.pop().endswith(f"-{os.getpid()}")
    # Several machines: each has its own agent; only the user can name the job.
    launched(GROUP_WORLD_SIZE="2")
    with pytest.raises(UserError, match="needs --rdzv-id=<job name>"):
        run_dir(str(tmp_path), "auto", [])


def test_a_job_without_a_name_on_several_machines_is_one_line_from_the_cli(tmp_path):
    several = {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_MAX_RESTARTS": "1"}
    result = run_in_process(
        "train.py", f"paths.log_dir={tmp_path}", env={**several, "GROUP_WORLD_SIZE": "2"}
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: torchrun with --max-restarts on several machines needs --rdzv-id=<job name>: "
        "it names the run folder that restarted workers go back to."
    )
    assert not any(tmp_path.iterdir())
