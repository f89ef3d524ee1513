"""`Restarts` (callbacks.restarts): what a job needs to survive the launcher running it again.

- torchrun --max-restarts: the process group meets in a store that outlives the workers
  (`litforge.elastic.torchrun`), formed in `prepare_run` before the Trainer is built.
- SLURM: one checkpoint and a requeue (`requeue_job`) on the job's warning signal before its
  time limit.

A job that is run again goes on from its last checkpoint by itself: under these launchers an
unset `ckpt_path` becomes `last` (`prepare_run`): the last checkpoint of the folder named after
the job (`litforge.runs.job_id`), or none yet: a fresh start.
"""

from __future__ import annotations

import logging
import os
import signal as _signal
import subprocess
from datetime import timedelta
from typing import Any

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from litforge.checkpoints import LastCheckpoint
from litforge.checks import accelerator_is_cpu
from litforge.elastic import torchrun
from litforge.errors import UserError
from litforge.hooks import PreparesRun
from litforge.runs import job_id, slurm_batch_job

log = logging.getLogger(__name__)


class Restarts(PreparesRun, L.Callback):
    """Under torchrun, the restart-safe process group (`prepare_run`). Under SLURM, on the job's
    warning signal before its time limit (`#SBATCH --signal=SIGUSR1@120` in
    scripts/slurm.sbatch): stop after the current batch, save `last.ckpt` as on SIGTERM
    (`litforge.checkpoints.LastCheckpoint`), and requeue the job (`requeue_job`); the requeued
    job, the same command in the same folder, resumes from it (`ckpt_path=last`). Elsewhere it
    does nothing.

    Lightning's own requeue is turned off: it writes `hpc_ckpt_<n>.ckpt` from inside the signal
    handler, a second kind of checkpoint that only its own resuming finds.
    """

    @classmethod
    def prepare_run(cls, cfg: DictConfig) -> None:
        """Where a launcher runs the job again: `ckpt_path` unset becomes `last`. Under torchrun
        with restarts, the job's process group is formed in the restart-safe store (the
        strategy's backend and timeout), before the Trainer is built."""
        launcher = restarting_launcher()
        if launcher == "torchrun" and job_id() is None:
            raise UserError(
                "torchrun with --max-restarts needs --rdzv-id=<job name>: it names the run "
                "folder that restarted workers go back to."
            )
        if launcher and cfg.get("train") and cfg.get("ckpt_path") is None:
            cfg.ckpt_path = "last"
        strategy, trainer = cfg.get("strategy") or {}, cfg.get("trainer") or {}
        if not torchrun.shared_agent_store():
            return
        backend = strategy.get("process_group_backend") or (
            "gloo" if accelerator_is_cpu(str(trainer.get("accelerator", "auto"))) else "nccl"
        )
        timeout = strategy.get("timeout")
        timeout = instantiate(timeout) if timeout is not None else timedelta(minutes=30)
        torchrun.form_process_group(backend, timeout)

    def __init__(self, signal: str = "SIGUSR1") -> None:
        if signal not in _signal.Signals.__members__:
            raise UserError(f"signal={signal} is not a signal name (e.g. SIGUSR1)")
        self.signal = _signal.Signals[signal]
        self.requested = False  # agreed by all tasks: stop and requeue
        self._signalled = False  # this task got the signal
        self._under_slurm = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from lightning.fabric.plugins.environments import SLURMEnvironment

        # What Lightning's signal handling reads (single-device strategies have none of their own)
        environment = trainer._accelerator_connector.cluster_environment
        self._under_slurm = isinstance(environment, SLURMEnvironment)
        if self._under_slurm:
            environment.auto_requeue = False  # read when Lightning sets its handlers, after this

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After Lightning has set its handlers: it puts back the ones before them when done.
        if self._under_slurm:
            _signal.signal(self.signal, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        log.info(f"{self.signal.name}: the job's time is nearly up; saving, then requeuing")
        self._signalled = True

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if restarting_launcher() == "torchrun" and not isinstance(exception, SIGTERMException):
            log.warning(torchrun_restarts())
        if not (self.requested and isinstance(exception, SIGTERMException)):
            return
        # Requeued only once last.ckpt is saved (Lightning calls checkpoint callbacks last).
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, LastCheckpoint):
                callback.on_exception(trainer, pl_module, exception)
        if trainer.is_global_zero:
            requeue_job()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._under_slurm:
            return
        # The tasks get the signal at slightly different moments: they agree after each batch,
        # so that all stop after the same one (a task that stopped alone would leave the others
        # waiting in their next collective). Then as on SIGTERM: Lightning raises at the end of
        # this batch, and the checkpoint is saved.
        if trainer.strategy.reduce_boolean_decision(self._signalled, all=False):
            self.requested = True
            trainer._signal_connector.received_sigterm = True


def restarting_launcher() -> str | None:
    """The launcher that runs this job again when it fails: torchrun --max-restarts, SLURM."""
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0:
        return "torchrun"
    return "slurm" if slurm_batch_job() else None


def torchrun_restarts() -> str:
    """What torchrun does next (each machine counts its own restarts)."""
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    done = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1:
        return "torchrun restarts the job while it has restarts left; it resumes by itself."
    if done < restarts:
        return (
            f"torchrun restarts the job (restart {done + 1} of {restarts}); it resumes by itself."
        )
    return "torchrun has no restarts left."


def requeue_job() -> None:
    """`scontrol requeue` this SLURM job (an array job: this task of it)."""
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    else:
        job = os.environ["SLURM_JOB_ID"]
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    except OSError as err:
        log.warning(f"Could not requeue SLURM job {job}: {err}. Resubmit it yourself.")
        return
    if result.returncode == 0:
        log.info(f"Requeued SLURM job {job}: it resumes from its last checkpoint.")
    else:
        problem = (result.stderr or result.stdout).strip().splitlines()[:1]
        log.warning(f"scontrol requeue {job} failed ({' '.join(problem) or result.returncode}).")
