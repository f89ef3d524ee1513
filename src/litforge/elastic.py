"""Jobs that a launcher restarts: torchrun (`--max-restarts`) after a lost worker, SLURM after a
requeue. Each restart runs the same command again, and that command goes on where the last
checkpoint left off; nothing here is needed otherwise.

1. Which launcher restarts this job: `restarting_launcher`; the default of `ckpt_path`
   (`${resume_default:}` in conf/train.yaml) is then `auto` (`litforge.resume.auto_checkpoint`).
2. torchrun: `restart_safe_store`, the store that the restarted workers' process group meets in.
3. SLURM: `SlurmRequeue`, one checkpoint and a requeue on the job's warning signal.
"""

from __future__ import annotations

import logging
import os
import signal as _signal
import subprocess
import time
import uuid
from datetime import timedelta
from typing import Any

import lightning as L

log = logging.getLogger(__name__)

# --- 1. which launcher ------------------------------------------------------------------------


def slurm_batch_job() -> bool:
    """A job SLURM started (`sbatch`, `srun`), not an interactive shell in an allocation: the
    processes Lightning treats as SLURM's (its `SLURMEnvironment.detect`)."""
    return "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in (
        "bash",
        "interactive",
    )


def restarting_launcher() -> str | None:
    """ "torchrun" (with restarts left to it) or "slurm" when the launcher may run this job's
    command again after a failure, else None."""
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0:
        return "torchrun"
    if slurm_batch_job():
        return "slurm"
    return None


def resume_default() -> str | None:
    """`${resume_default:}`: `auto` where a launcher restarts jobs, else None (start fresh)."""
    return "auto" if restarting_launcher() else None


def how_to_resume() -> str:
    """How the job goes on after a stop: by itself under a launcher that restarts it."""
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


# --- 2. torchrun ------------------------------------------------------------------------------


def shared_agent_store() -> bool:
    """Whether torchrun's workers meet in the store its agent serves, which outlives them (not
    with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def restart_safe_store(rank: int, world_size: int, timeout: timedelta) -> Any | None:
    """The store for `init_process_group` under torchrun, or None elsewhere.

    torchrun's workers meet in the store its agent serves (`TORCHELASTIC_USE_AGENT_STORE`), and
    the agent keeps that store across restarts (c10d rendezvous, pytorch #135712): the workers of
    a restart would read the addresses the dead workers left there, and fail to connect or hang.
    Here each start of the job agrees on a fresh key prefix first (`_agree_on_round`).
    """
    if not shared_agent_store():
        return None
    from torch.distributed import PrefixStore, TCPStore

    store = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=timeout,
    )
    return PrefixStore(f"litforge/{_agree_on_round(store, rank, world_size, timeout)}", store)


def _agree_on_round(store: Any, rank: int, world_size: int, timeout: timedelta) -> str:
    """A name that all `world_size` processes of this start agree on, and no earlier start used.

    Keys left by an earlier start look like fresh ones, so each process asks with a name of its
    own making (`hello/<rank>` = a new random name) and is answered under that name: rank 0
    answers every `hello` it sees, stale ones included, with its own new name, until each rank
    has confirmed under that new name that it has it.
    """
    if rank != 0:
        mine = uuid.uuid4().hex
        store.set(f"hello/{rank}", mine)
        agreed = store.get(f"answer/{rank}/{mine}").decode()  # waits up to the store's timeout
        store.set(f"confirmed/{agreed}/{rank}", "1")
        return agreed
    agreed, waiting = uuid.uuid4().hex, set(range(1, world_size))
    deadline = time.monotonic() + timeout.total_seconds()
    while waiting:
        for other in sorted(waiting):
            if store.check([f"confirmed/{agreed}/{other}"]):
                waiting.discard(other)
            elif store.check([f"hello/{other}"]):
                store.set(f"answer/{other}/{store.get(f'hello/{other}').decode()}", agreed)
        if time.monotonic() > deadline:
            from torch.distributed import DistStoreError

            raise DistStoreError(f"ranks {sorted(waiting)} did not join within {timeout}")
        if waiting:
            time.sleep(0.05)
    return agreed


# --- 3. SLURM ---------------------------------------------------------------------------------


class SlurmRequeue(L.Callback):
    """Under SLURM, on the job's warning signal before its time limit (`#SBATCH
    --signal=SIGUSR1@120` in scripts/slurm.sbatch): stop after the current batch, save
    `last.ckpt` as on SIGTERM (`litforge.resume.LastCheckpoint`), and requeue the job
    (`requeue_job`); the requeued job, the same command in the same folder, resumes from it
    (`ckpt_path=auto`). Elsewhere it does nothing.

    Lightning's own requeue is turned off: it writes `hpc_ckpt_<n>.ckpt` from inside the signal
    handler, a second kind of checkpoint that only its own resuming finds.
    """

    def __init__(self, signal: str = "SIGUSR1") -> None:
        if signal not in _signal.Signals.__members__:
            raise ValueError(f"signal={signal} is not a signal name (e.g. SIGUSR1)")
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
