"""torchrun --max-restarts: the process group of a restarted job meets in `restart_safe_store`,
formed by `form_process_group` before Lightning's strategy would form it (it keeps a group it
finds made)."""

from __future__ import annotations

import logging
import os
import time
import uuid
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)


def shared_agent_store() -> bool:
    """Whether torchrun's workers meet in the store its agent serves, which outlives them (not
    with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def restart_safe_store(rank: int, world_size: int, timeout: timedelta) -> Any | None:
    """The store for `init_process_group` under torchrun, or None elsewhere.

    torchrun's workers meet in the store its agent serves (`TORCHELASTIC_USE_AGENT_STORE`), and
    the agent keeps that store across restarts (c10d rendezvous, pytorch #135712): the workers of
    a restart would read the addresses the dead workers left there, and fail to connect or hang.
    Here each start of the job agrees on a fresh key prefix first (`_agree_on_round`), under the
    job's rendezvous id: jobs may share one rendezvous store (`--rdzv-endpoint`).
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
    job = PrefixStore(f"litforge/{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}", store)
    return PrefixStore(_agree_on_round(job, rank, world_size, timeout), job)


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


def form_process_group(backend: str, timeout: timedelta) -> bool:
    """The job's process group, in `restart_safe_store`, when this is a torchrun worker whose
    agent serves the store; False elsewhere (Lightning forms it as usual)."""
    import torch
    import torch.distributed as dist

    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if dist.is_initialized() or world_size < 2:
        return False
    store = restart_safe_store(rank, world_size, timeout)
    if store is None:
        return False
    device = None
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timeout, device_id=device
    )
    return True
