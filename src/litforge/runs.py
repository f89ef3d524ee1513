"""Which cluster launcher started a run, and the resolvers conf/ names its folder with. No torch
here: resolvers run before the task does."""

import os
import socket

from omegaconf import OmegaConf

from litforge.errors import UserError


def slurm_batch_job() -> bool:
    """Not an interactive shell in an allocation: as Lightning's `SLURMEnvironment.detect`."""
    interactive = os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive")
    return "SLURM_NTASKS" in os.environ and not interactive


def restarting_launcher() -> str | None:
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0:
        return "torchrun"
    return "slurm" if slurm_batch_job() else None


def how_to_resume() -> str:
    if restarting_launcher() == "torchrun":
        if several_machines():  # each machine counts its own restarts
            return "torchrun restarts the job while it has restarts left; it resumes by itself"
        restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
        done = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if done < restarts:
            return (
                f"torchrun restarts the job (restart {done + 1} of {restarts}), which resumes "
                f"from its last checkpoint"
            )
        return "torchrun has no restarts left; to resume, run it again with ckpt_path=last"
    return "to resume, run the same command with ckpt_path=last"


def job_id() -> str | None:
    """The cluster launcher's name for this job, or None: all processes of a multi-node job, and
    the job once restarted or requeued, agree on it (and its folder), where timestamps don't."""
    if slurm_batch_job() and os.environ.get("SLURM_JOB_ID"):
        array = os.environ.get("SLURM_ARRAY_TASK_ID")
        return f"slurm-{os.environ['SLURM_JOB_ID']}" + (f"-{array}" if array else "")
    torchrun = os.environ.get("TORCHELASTIC_RUN_ID")
    if torchrun and torchrun != "none":
        return f"torchrun-{torchrun}"
    if torchrun == "none" and restarting_launcher() == "torchrun" and not several_machines():
        # No --rdzv-id: the restarted workers of one machine still share their agent (parent).
        return f"torchrun-{socket.gethostname()}-{os.getppid()}"
    return None


def several_machines() -> bool:  # torchrun's agents, one a machine
    return int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1


def check_job_named() -> None:
    """A job torchrun restarts needs a name that its restarted workers find their folder by."""
    if restarting_launcher() == "torchrun" and job_id() is None:
        raise UserError(
            "torchrun with --max-restarts on several machines needs --rdzv-id=<job name>: "
            "it names the run folder that restarted workers go back to."
        )


def register_resolvers() -> None:
    """The resolvers conf/ uses, for the entry points (and anything else that composes conf/)
    to call before Hydra composes it. Neither reads the disk."""
    # `${cwd:}`: `-m` resolves `hydra.sweep.dir` before `${hydra:runtime.cwd}` exists.
    OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)
    # `${job_id:<default>}`: the launcher's job id (run folder of every process and restart of
    # one job), else the default (a new `${now:...}` folder).
    OmegaConf.register_new_resolver("job_id", lambda default: job_id() or default, replace=True)
