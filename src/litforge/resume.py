"""Surviving a stop, and finding the checkpoint to continue from:

1. Stopping: `stopped_by_sigterm`, exit status 143.
2. Finding: `run_dir` (the `${run_dir:...}` resolver of conf/hydra/default.yaml) sends
   `ckpt_path=last` (and `auto`) back into the run it continues, `newest_loadable` picks its
   checkpoint (`auto_checkpoint`: or none, to start fresh), `checked_checkpoint` checks that it
   fits the configured model and data.

Writing and reading checkpoints: `litforge.checkpoints`.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import OmegaConf

from litforge import elastic, slurm
from litforge.checkpoints import (
    LastCheckpoint,
    check_same_dataset,
    check_same_shapes,
    is_whole,
    read_checkpoint,
    which_checkpoint,
)
from litforge.errors import UserError

log = logging.getLogger(__name__)

# --- 1. stopping ------------------------------------------------------------------------------


@contextmanager
def stopped_by_sigterm(trainer: L.Trainer, what: str) -> Iterator[None]:
    """Lightning stops on SIGTERM by raising SIGTERMException, a SystemExit with status 0 (fixed
    after 2.6.6, Lightning #19916 / PR #21623); exit with 143 (128 + SIGTERM, what schedulers
    expect of a stopped job) instead, saying so. Stopped by SLURM's warning signal
    (`slurm.SlurmRequeue`): requeue the job once the checkpoint is saved."""
    try:
        yield
    except SIGTERMException:
        requeue = any(
            isinstance(cb, slurm.SlurmRequeue) and cb.requested for cb in trainer.callbacks
        )
        if trainer.is_global_zero:
            saved = [cb for cb in trainer.callbacks if isinstance(cb, LastCheckpoint)]
            where = f"saved to {saved[0].path}" if saved else "not saved"
            how = "the requeued job resumes from it" if requeue else elastic.how_to_resume()
            log.warning(
                f"Stopped by {'SLURM' if requeue else 'SIGTERM'} while {what} at epoch "
                f"{trainer.current_epoch}, step {trainer.global_step}; checkpoint {where}: {how}."
            )
            if requeue:
                slurm.requeue_job()
        sys.exit(143)


# --- 2. finding --------------------------------------------------------------------------------


def job_id() -> str | None:
    """The cluster launcher's name for this job: `slurm-<job id>[-<array task>]`,
    `torchrun-<rendezvous id>`; None when started otherwise.

    Every process of a multi-node job computes this for itself; a shared job id puts them all
    into one folder, where timestamps taken on different machines could differ by a second. A
    restarted or requeued job keeps its id, and so its folder.
    """
    if slurm.slurm_batch_job() and os.environ.get("SLURM_JOB_ID"):
        array = os.environ.get("SLURM_ARRAY_TASK_ID")
        return f"slurm-{os.environ['SLURM_JOB_ID']}" + (f"-{array}" if array else "")
    torchrun = os.environ.get("TORCHELASTIC_RUN_ID")
    if torchrun and torchrun != "none":
        return f"torchrun-{torchrun}"
    if torchrun == "none" and elastic.restarting_launcher() == "torchrun":
        # No --rdzv-id: the restarted workers of one machine still share their agent (parent).
        if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1:
            raise UserError(
                "torchrun with --max-restarts on several machines needs --rdzv-id=<job name>: "
                "it names the run folder that restarted workers go back to."
            )
        return f"torchrun-{socket.gethostname()}-{os.getppid()}"
    return None


def run_id() -> str:
    """A new run's folder name: the job id when a cluster launcher gives one, else the time."""
    return job_id() or datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def run_dir(runs_root: str, ckpt_path: str | None, overrides: Any = None, fits: Any = True) -> str:
    """`${run_dir:<runs root>,${ckpt_path},${hydra.overrides.task},${train}}`: the folder of a
    training run that continues an earlier run of the same command (the same overrides,
    ckpt_path aside): with `ckpt_path=last` the newest such run that holds a checkpoint; with
    `auto` the job's own folder under a cluster launcher, else the newest unfinished such run
    (checkpoints, no metrics.json); with a checkpoint file of such a run that run. Anything else:
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
        elif (run := Path(ckpt_path).expanduser().resolve().parent.parent) in {
            r.resolve() for r in runs
        }:
            return str(run)
    return str(root / run_id())


def _command(run: Path) -> list[str] | None:
    saved = run / ".hydra" / "overrides.yaml"
    return _without_ckpt_path(OmegaConf.load(saved)) if saved.is_file() else None


def _without_ckpt_path(overrides) -> list[str]:
    return [o for o in overrides if not o.startswith("ckpt_path=")]


def newest_loadable(checkpoint_dir: Path, required: bool = True) -> Path | None:
    """The newest checkpoint in `checkpoint_dir` that loads; broken ones are named and skipped.
    None if there is none and not `required`."""
    candidates = sorted(
        checkpoint_dir.glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for path in candidates:
        if path.is_dir() and not is_whole(path):
            log.warning(f"Skipping {path}: a folder of shards cut off while written")
            continue
        try:
            checkpoint = {} if path.is_dir() else read_checkpoint(path)
        except UserError as err:
            log.warning(f"Skipping {path}: {err}")
            continue
        where = (
            f"epoch {checkpoint['epoch']}, step {checkpoint['global_step']}"
            if checkpoint
            else "shards"
        )
        _on_rank_zero(log.info, f"Resuming from {path} ({where})")
        return path
    if not required:
        return None
    raise UserError(
        f"ckpt_path=last: no checkpoint to resume in {checkpoint_dir}. Run the same command "
        f"without ckpt_path to start, or give ckpt_path=<file>."
    )


def auto_checkpoint(output_dir: str, fitting: bool = True) -> Path | None:
    """`ckpt_path=auto`: the newest checkpoint of this run's folder that loads, or None to start
    fresh; one line says which. (Testing only, `fitting` false: a UserError if there is none.)"""
    checkpoints = Path(output_dir) / "checkpoints"
    found = newest_loadable(checkpoints, required=False) if checkpoints.is_dir() else None
    if found is None and not fitting:
        raise UserError(
            f"ckpt_path=auto: no checkpoint in {checkpoints} to test (train=false). Give "
            f"ckpt_path=<file or folder>."
        )
    if found is None:
        _on_rank_zero(log.info, f"No checkpoint in {checkpoints}, starting fresh")
    return found


def _on_rank_zero(say: Any, message: str) -> None:
    """Said once per job, before the processes know their ranks from the strategy (Lightning
    reads them from the launcher's environment)."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    if rank_zero_only.rank == 0:
        say(message)


def checked_checkpoint(
    ckpt_path: str,
    output_dir: str,
    model: L.LightningModule,
    dataset: str | None,
    fitting: bool,
    sharded: bool,
) -> tuple[str, dict[str, Any] | None]:
    """The checkpoint `ckpt_path` names (`last`: the newest of this run that loads), and its
    contents, checked to fit `model` and `dataset` before anything starts. A folder of shards to
    fit from is left to the (`sharded`) strategy, which reads and checks it."""
    if ckpt_path == "last":
        checkpoints = Path(output_dir) / "checkpoints"
        if not checkpoints.is_dir():  # ${run_dir:} found no earlier run of this command
            raise UserError(
                f"ckpt_path=last: no earlier run of this command (the same overrides, ckpt_path "
                f"aside) has a checkpoint in {Path(output_dir).parent}. Resume a given "
                f"run with hydra.run.dir=<its folder> ckpt_path=last, or ckpt_path=<file>."
            )
        ckpt_path = str(newest_loadable(checkpoints))
    if fitting and Path(ckpt_path).is_dir():
        if not is_whole(Path(ckpt_path)):
            raise UserError(which_checkpoint(Path(ckpt_path), "ckpt_path"))
        if not sharded:
            raise UserError(
                f"{ckpt_path} is a folder of shards: training resumes from it with "
                f"strategy=model_parallel at the size that wrote it (to test it: train=false)."
            )
        return ckpt_path, None
    checkpoint = read_checkpoint(ckpt_path)
    check_same_dataset(checkpoint, dataset, ckpt_path, model.hparams.get("class_names"))
    check_same_shapes(checkpoint["state_dict"], model.state_dict(), ckpt_path)
    return ckpt_path, checkpoint
