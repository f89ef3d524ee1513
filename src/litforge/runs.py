"""Which cluster launcher started a run, and the resolvers conf/ names its folder with. No torch
here: resolvers run before the task does."""

import os
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
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


class RunFolderCheck(Callback):
    """`hydra.callbacks` (conf/hydra/default.yaml): a run folder that cannot be made or written
    (under a file, on a read-only mount, immutable, not ours) is one `error:` line naming it and
    exit status 1, before Hydra's own `mkdir` would end in a traceback. (Not a sweep's folder:
    the launcher resolves its `${now:...}` again, later, in a config of its own.)"""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        check_writable(config, "hydra.run.dir")


def check_writable(config: Any, key: str) -> None:
    from litforge.errors import say_error

    try:
        folder = Path(str(OmegaConf.select(config, key)))
    except Exception:  # a value that does not resolve: Hydra says so as it always does
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        say_error(
            f"cannot write the run folder {folder} ({err.strerror or err}): set "
            f"{key}=<a folder you can write>."
        )
        raise SystemExit(1) from None
