"""Where a run writes (a new folder, or that of the run `ckpt_path` continues), and which launcher
started it. No torch here: the `${run_dir:...}` resolver runs before the task does."""

import os
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

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
        if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1:  # each machine counts its own
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
    if torchrun == "none" and restarting_launcher() == "torchrun":
        # No --rdzv-id: the restarted workers of one machine still share their agent (parent).
        if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1:
            raise UserError(
                "torchrun with --max-restarts on several machines needs --rdzv-id=<job name>: "
                "it names the run folder that restarted workers go back to."
            )
        return f"torchrun-{socket.gethostname()}-{os.getppid()}"
    return None


def run_id() -> str:
    return job_id() or datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def run_dir(runs_root: str, ckpt_path: str | None, overrides: Any = None, fits: Any = True) -> str:
    """The folder of a training run that continues an earlier run of the same command (overrides
    but ckpt_path): `last`, the newest that holds a checkpoint; `auto`, the job's own folder under
    a cluster launcher, else the newest unfinished one; a checkpoint file of one, that one. Else
    a new `<runs_root>/<run id>`."""
    root = Path(runs_root)
    if ckpt_path == "auto" and job_id():
        return str(root / run_id())
    if fits and ckpt_path and root.is_dir():
        command = _without_ckpt_path(overrides or [])
        runs = [run for run in root.iterdir() if _command(run) == command]
        if ckpt_path == "auto":
            runs = [run for run in runs if not (run / "metrics.json").exists()]
        if ckpt_path in ("last", "auto"):
            newest = {
                r: max((p.stat().st_mtime for p in r.glob("checkpoints/*.ckpt")), default=0)
                for r in runs
            }
            if any(newest.values()):
                return str(max(newest, key=newest.__getitem__))
        else:  # <run>/checkpoints/<file>
            run = Path(ckpt_path).expanduser().resolve().parent.parent
            if run in {r.resolve() for r in runs}:
                return str(run)
    return str(root / run_id())


def _command(run: Path) -> list[str] | None:
    saved = run / ".hydra" / "overrides.yaml"
    return _without_ckpt_path(OmegaConf.load(saved)) if saved.is_file() else None


def _without_ckpt_path(overrides) -> list[str]:
    return [o for o in overrides if not o.startswith("ckpt_path=")]
