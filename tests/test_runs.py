"""Where a run writes (conf/hydra/default.yaml, with litforge/runs.py's `${job_id:...}`) and what
a job that a launcher runs again continues from (`litforge.resume.default_checkpoint`)."""

import os
import re
import subprocess
import sys

import pytest
from helpers import CONF, SLURM, compose_config, run_in_process
from omegaconf import OmegaConf

from litforge.errors import UserError
from litforge.resume import default_checkpoint
from litforge.runs import job_id, register_resolvers


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


def run_folder() -> str:
    """conf/hydra/default.yaml's `hydra.run.dir`, resolved as Hydra resolves it."""
    from hydra.core.utils import setup_globals

    setup_globals()  # Hydra's own resolvers: ${now:...}
    register_resolvers()
    run = OmegaConf.load(CONF / "hydra" / "default.yaml").run
    config = OmegaConf.create({"paths": {"log_dir": "logs"}, "task_name": "train", "run": run})
    return config.run.dir


@pytest.mark.parametrize(
    ("variables", "folder"),
    [
        ({}, None),
        ({"TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_MAX_RESTARTS": "1"}, "torchrun-job7"),
        ({"TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_MAX_RESTARTS": "0"}, "torchrun-job7"),
        ({**SLURM, "SLURM_JOB_ID": "12"}, "slurm-12"),
        ({**SLURM, "SLURM_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "3"}, "slurm-12-3"),
        ({**SLURM, "SLURM_JOB_ID": "12", "SLURM_JOB_NAME": "bash"}, None),  # srun --pty bash
    ],
)
def test_the_run_folder_is_the_time_or_the_launchers_job_id(launched, variables, folder):
    # Read from the environment, never from the disk: no earlier run decides it.
    launched(**variables)
    parent, _, name = run_folder().rpartition("/")
    assert parent == "logs/train/runs"
    if folder is None:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", name), name
    else:
        assert name == folder


@pytest.mark.slow  # two interpreters
def test_torchrun_restarts_without_a_rendezvous_id(tmp_path, launched):
    # One machine: the restarted workers share their agent (here: this process), which names
    # the folder.
    launched(TORCHELASTIC_RUN_ID="none", TORCHELASTIC_MAX_RESTARTS="1")
    worker = "from litforge.runs import job_id; print(job_id())"
    folders = {
        subprocess.run(
            [sys.executable, "-c", worker], capture_output=True, text=True
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(folders) == 1 and folders.pop().endswith(f"-{os.getpid()}")
    # Several machines: each has its own agent; only the user can name the job.
    launched(GROUP_WORLD_SIZE="2")
    assert job_id() is None
    with pytest.raises(UserError, match="needs --rdzv-id=<job name>"):
        default_checkpoint(None)


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
    assert not any((tmp_path / "train" / "runs").iterdir())  # the run's folder went
