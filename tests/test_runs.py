"""Where a run writes (conf/hydra/default.yaml, with litforge/runs.py's `${job_id:...}`): a new
folder named after the time, or after the cluster launcher's job (all processes agree on it)."""

import re

import pytest
from helpers import CONF, SLURM
from omegaconf import OmegaConf

from litforge.runs import register_resolvers


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
        ({"TORCHELASTIC_RUN_ID": "none"}, None),  # torchrun without --rdzv-id
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
