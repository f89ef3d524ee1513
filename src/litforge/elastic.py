"""Jobs that a launcher restarts: torchrun (`--max-restarts`) after a lost worker, SLURM after a
requeue. Each restart runs the same command again, and that command goes on where the last
checkpoint left off; nothing here is needed otherwise.

1. Which launcher restarts this job: `restarting_launcher`; the default of `ckpt_path`
   (`${resume_default:}` in conf/train.yaml) is then `auto` (`litforge.resume.auto_checkpoint`).
2. torchrun: `restart_safe_store`, the store that the restarted workers' process group meets in.

SLURM's own part (a checkpoint and a requeue on the job's warning signal) is `litforge.slurm`.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from datetime import timedelta
from typing import Any

from litforge import slurm

log = logging.getLogger(__name__)

# --- 1. which launcher ------------------------------------------------------------------------


def restarting_launcher() -> str | None:
    """ "torchrun" (with restarts left to it) or "slurm" when the launcher may run this job's
    command again after a failure, else None."""
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0:
        return "torchrun"
    if slurm.slurm_batch_job():
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
