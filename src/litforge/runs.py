"""Which cluster launcher started a run, and the resolvers conf/ names its folder with. No torch
here: resolvers run before the task does."""

import os

from omegaconf import OmegaConf


def slurm_batch_job() -> bool:
    """Not an interactive shell in an allocation: as Lightning's `SLURMEnvironment.detect`."""
    interactive = os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive")
    return "SLURM_NTASKS" in os.environ and not interactive


def job_id() -> str | None:
    """The cluster launcher's name for this job, or None: all processes of a multi-node job, and
    the job once run again, agree on it (and its folder), where timestamps don't."""
    if slurm_batch_job() and os.environ.get("SLURM_JOB_ID"):
        array = os.environ.get("SLURM_ARRAY_TASK_ID")
        return f"slurm-{os.environ['SLURM_JOB_ID']}" + (f"-{array}" if array else "")
    torchrun = os.environ.get("TORCHELASTIC_RUN_ID")  # torchrun's --rdzv-id ("none" unless set)
    return f"torchrun-{torchrun}" if torchrun and torchrun != "none" else None


def register_resolvers() -> None:
    """The resolvers conf/ uses, for the entry points (and anything else that composes conf/)
    to call before Hydra composes it. Neither reads the disk."""
    # `${cwd:}`: `-m` resolves `hydra.sweep.dir` before `${hydra:runtime.cwd}` exists.
    OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)
    # `${job_id:<default>}`: the launcher's job id (run folder of every process and restart of
    # one job), else the default (a new `${now:...}` folder).
    OmegaConf.register_new_resolver("job_id", lambda default: job_id() or default, replace=True)
