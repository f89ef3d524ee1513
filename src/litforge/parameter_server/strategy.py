"""`strategy=parameter_server`: server processes hold the parameters and the optimizer state;
worker processes compute gradients on their shard of the data, push them to the servers and pull
fresh parameters back.

- `mode=sync`: a server steps once every worker has pushed, on the mean of their gradients: the
  same steps as DDP on the same global batch, with the reduction on the servers.
- `mode=async`: a server steps on each push as it arrives, and a worker pulls only when its
  parameters are more than `max_staleness` server steps old: fast workers do not wait for slow
  ones between steps. A worker that dies is left behind: the others meet at the end of each
  epoch and, without it, form their process group again (`ParameterServerStrategy.meet`).

The last `num_servers` processes of the job are the servers; the others are the workers, and
they are all Lightning sees: they form the job's process group as under DDP (validation, test,
logging and checkpoints work as there), without DDP's gradient all-reduce, and their optimizer's
`step` pushes and pulls instead. The parameters are split across the servers by size. Servers
and workers talk point to point in a second gloo group, over flat CPU buffers: one message per
push, one per pull. (torch.distributed.rpc would do too, but it is in maintenance mode, its
shutdown waits on every worker, so one dead worker hangs it, and each call pickles its
arguments; gloo's send and recv move a tensor as it is and fail at once when the peer dies.)

A checkpoint holds the servers' parameters and optimizer state in the single-device format, so
every reader of checkpoints reads it as any other, and `ckpt_path=last` resumes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.strategies import DDPStrategy as _LightningDDPStrategy
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only
from omegaconf import DictConfig, OmegaConf

from litforge.errors import UserError
from litforge.hooks import PreparesRun
from litforge.settings import NonNegativeInt, PositiveInt
from litforge.strategies import ReportsLostProcesses

log = logging.getLogger(__name__)

# Every message starts with a header of 4 integers. A worker's: kind, the version of its
# parameters, a size (INIT: bytes that follow; PUSH: learning rates that follow, then the
# gradients). A server's reply: status, its version, whether parameters follow (STATE: bytes),
# and how many pushes it has taken from all workers. MEET (async, to the first server only): the
# worker's round; the reply: how many workers are left, then their ranks.
PUSH, PULL, STATE, INIT, DONE, MEET = 1, 2, 3, 4, 5, 6
OK, STOP = 0, 1
GROUP_PREFIX = "litforge/parameter_server"


def split_by_size(numels: list[int], num_servers: int) -> list[list[int]]:
    """Parameter indices for each server: the largest first, each to the least loaded server."""
    shards: list[list[int]] = [[] for _ in range(num_servers)]
    loads = [0] * num_servers
    for index in sorted(range(len(numels)), key=lambda i: -numels[i]):
        server = loads.index(min(loads))
        shards[server].append(index)
        loads[server] += numels[index]
    return [sorted(shard) for shard in shards]


def _to_bytes(obj: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _from_bytes(data: torch.Tensor) -> Any:
    # From this job's own processes: an optimizer class travels in it, so not weights_only.
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)


def _header(*values: int) -> torch.Tensor:
    header = torch.zeros(4, dtype=torch.int64)
    header[: len(values)] = torch.tensor(values, dtype=torch.int64)
    return header


class PeerLost(dist.DistError):
    """The process at the other end died, did not answer within the timeout, or (a server's
    STOP) the job is stopping: reported as a lost process (strategies.ReportsLostProcesses)."""


class _Channel:
    """Point-to-point messages in the gloo group of workers and servers."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def send(self, peer: int, *tensors: torch.Tensor) -> None:
        try:
            for tensor in tensors:
                self.group.send([tensor.contiguous()], peer, 0).wait()
        except RuntimeError as err:
            raise PeerLost(str(err)) from err

    def recv(self, peer: int, tensor: torch.Tensor) -> torch.Tensor:
        try:
            self.group.recv([tensor], peer, 0).wait()
        except RuntimeError as err:
            raise PeerLost(str(err)) from err
        return tensor


def connect(rank: int, size: int, timeout: timedelta) -> dist.ProcessGroup:
    """The group of all of the job's processes (workers first, then servers), met in the store of
    the workers' own group (MASTER_ADDR:MASTER_PORT, which the launcher set)."""
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timeout,
    )
    return dist.ProcessGroupGloo(dist.PrefixStore(GROUP_PREFIX, store), rank, size, timeout)


class Server:
    """One server: its shard of the parameters, their optimizer, and a thread per worker that
    answers that worker's messages. `run()` returns once every worker is done (0), or after a
    worker was lost in sync mode (1), when the others are told to stop."""

    def __init__(
        self, channel: _Channel, index: int, workers: list[int], mode: str, staleness: int
    ):
        self.channel, self.index, self.workers = channel, index, workers
        self.mode, self.max_staleness = mode, staleness
        self.live = set(workers)
        self.version = 0
        self.failure: str | None = None
        self.changed = threading.Condition()
        self.ready = threading.Event()
        self.arrived, self.grad_sum = 0, None
        self.pushes = 0  # taken from all workers together: async epochs end on this count
        self.met: dict[int, set[int]] = {}  # async: the workers at each round's meeting

    def run(self) -> int:
        threads = [
            threading.Thread(target=self._serve_or_exit, args=(w,), daemon=True)
            for w in self.workers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return 1 if self.failure else 0

    # -- state ------------------------------------------------------------------------------

    def _init(self, blob: dict) -> None:
        """From worker 0 at the start of training: this shard's parameters (and optimizer state,
        when resuming), and how to build the optimizer."""
        params = blob["params"]
        self.flat = torch.cat([p.reshape(-1) for p in params])
        self.numels = [p.numel() for p in params]
        views = self.flat.split(self.numels)
        self.params = [v.view_as(p) for v, p in zip(views, params, strict=True)]
        # One optimizer group per worker group that has parameters here, in the same order.
        group_of = blob["group_of"]  # the worker's group index of each parameter
        groups, self.group_index = [], []
        for g, hyper in enumerate(blob["groups"]):
            members = [p for p, of in zip(self.params, group_of, strict=True) if of == g]
            if members:
                groups.append({**hyper, "params": members})
                self.group_index.append(g)
        # Every group carries all its settings; `lr` only because some optimizers require it.
        self.optimizer = blob["optimizer"](groups, lr=groups[0]["lr"])
        for param, state in zip(self.params, blob["state"], strict=True):
            if state:
                self.optimizer.state[param] = state
        self.version = blob["version"]
        self.ready.set()

    def _step(self, grads: torch.Tensor, lrs: torch.Tensor) -> None:
        for param, grad in zip(self.params, grads.split(self.numels), strict=True):
            param.grad = grad.view_as(param)
        for group, g in zip(self.optimizer.param_groups, self.group_index, strict=True):
            group["lr"] = lrs[g].item()  # the workers' schedulers set it
        self.optimizer.step()
        self.version += 1

    def _state(self) -> dict:
        state = [self.optimizer.state.get(p, {}) for p in self.params]
        return {"params": [p.clone() for p in self.params], "state": state, "version": self.version}

    # -- messages ---------------------------------------------------------------------------

    def _serve_or_exit(self, worker: int) -> None:
        try:
            self._serve(worker)
        except Exception:  # a bug, not a lost worker: no server may go on half-working
            log.exception("parameter server %d failed", self.index)
            logging.shutdown()
            os._exit(1)

    def _serve(self, worker: int) -> None:
        header = torch.zeros(4, dtype=torch.int64)
        while True:
            try:
                kind, version, nbytes, _ = self.channel.recv(worker, header).tolist()
                if kind == DONE:  # nbytes: 1 when the worker stopped on an error of its own
                    with self.changed:
                        if nbytes and self.failure is None:  # it says why; the job stops
                            self.failure = f"worker rank {worker} stopped on an error"
                            log.info("parameter server %d: %s", self.index, self.failure)
                            self.ready.set()
                        elif self.mode == "sync" and self.arrived:  # others wait for its push
                            self._fail(worker, "finished while the others were still training")
                        self.live.discard(worker)
                        self.changed.notify_all()
                    return
                if kind == INIT:
                    data = self.channel.recv(worker, torch.empty(nbytes, dtype=torch.uint8))
                    self._init(_from_bytes(data))
                    continue
                self.ready.wait()
                if self.failure is not None and not hasattr(self, "flat"):  # never initialized
                    self.channel.send(worker, _header(STOP))
                    return
                if kind == PULL:
                    with self.changed:
                        reply = _header(OK, self.version, 1, self.pushes), self.flat.clone()
                    self.channel.send(worker, *reply)
                elif kind == MEET:
                    self.channel.send(worker, *self._meet(worker, version))
                elif kind == STATE:
                    with self.changed:
                        data = _to_bytes(self._state())
                    self.channel.send(worker, _header(OK, self.version, data.numel()), data)
                elif kind == PUSH:
                    lrs = self.channel.recv(worker, torch.empty(nbytes, dtype=torch.float64))
                    grads = self.channel.recv(worker, torch.empty_like(self.flat))
                    self.channel.send(worker, *self._push(grads, lrs, version))
                    if self.failure is not None:  # told to stop: nothing more to serve it
                        return
            except PeerLost as err:  # the worker's process died or stopped answering
                self._lost(worker, err)
                return

    def _push(self, grads: torch.Tensor, lrs: torch.Tensor, version: int) -> tuple:
        with self.changed:
            self.pushes += 1
            if self.mode == "async":
                self._step(grads, lrs)
                if self.version - version <= self.max_staleness:
                    return (_header(OK, self.version, 0, self.pushes),)
                return _header(OK, self.version, 1, self.pushes), self.flat.clone()
            # sync: the last worker of the round steps on the mean; the others wait for it
            target = self.version + 1
            self.grad_sum = grads if self.arrived == 0 else self.grad_sum.add_(grads)
            self.arrived += 1
            self.changed.notify_all()
            if self.failure is None and self.arrived == len(self.live):
                self._step(self.grad_sum.div_(self.arrived), lrs)
                self.arrived = 0
                self.changed.notify_all()
            while self.version < target and self.failure is None:
                self.changed.wait()
            if self.failure is not None:
                return (_header(STOP, self.version, 0),)
            return _header(OK, self.version, 1, self.pushes), self.flat.clone()

    def _meet(self, worker: int, round_: int) -> tuple:
        """Async, at the end of each epoch: once every live worker is here (or lost on the
        way), who they are. They then form their process group again without the lost."""
        with self.changed:
            met = self.met.setdefault(round_, set())
            met.add(worker)
            self.changed.notify_all()
            while not self.live <= met and self.failure is None:
                self.changed.wait()
            if self.failure is not None:
                return (_header(STOP, self.version, 0),)
            members = torch.tensor(sorted(self.live), dtype=torch.int64)
            return _header(OK, self.version, members.numel()), members

    def _fail(self, worker: int, what: str) -> None:
        """Stop: every waiting and later push is answered STOP (call with `changed` held)."""
        self.failure = f"worker rank {worker} {what}"
        log.error(
            "parameter server %d: worker rank %d %s; %s training cannot go on without it, so "
            "the job stops.",
            self.index,
            worker,
            what,
            "synchronous" if self.mode == "sync" else "asynchronous",
        )
        self.ready.set()  # threads waiting for worker 0's parameters answer STOP
        self.changed.notify_all()

    def _lost(self, worker: int, err: RuntimeError) -> None:
        with self.changed:
            if worker not in self.live or self.failure is not None:
                return
            self.live.discard(worker)
            reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
            if self.mode == "sync" or not self.ready.is_set():
                self._fail(worker, f"was lost ({reason})")
            elif self.live:
                log.warning(
                    "parameter server %d: worker rank %d was lost; asynchronous training goes on "
                    "with worker rank(s) %s.",
                    self.index,
                    worker,
                    ", ".join(map(str, sorted(self.live))) or "none",
                )
            self.changed.notify_all()


class ServerClient:
    """A worker's side: pushes its gradients to each server's shard and pulls parameters back."""

    def __init__(self, channel: _Channel, servers: list[int], params: list[torch.Tensor]):
        self.channel, self.servers, self.params = channel, servers, params
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise UserError(f"strategy=parameter_server needs one parameter dtype, not {dtypes}.")
        if len(params) < len(servers):
            raise UserError(
                f"strategy.num_servers={len(servers)} is more than the network's {len(params)} "
                f"parameter tensors: each server needs one at least. Use fewer servers."
            )
        self.shards = split_by_size([p.numel() for p in params], len(servers))
        self.versions = [0] * len(servers)
        self.started = False  # the servers have the parameters
        self.pushes = 0  # this worker's steps, counted towards `every`
        self.job_pushes = 0  # all workers' pushes, as the first server counted them
        self.accumulated: list[torch.Tensor] | None = None

    def _gradients(self, shard: list[int]) -> torch.Tensor:
        parts = []
        for i in shard:
            param = self.params[i]
            grad = param.grad  # None: unused this step, so zeros
            parts.append(torch.zeros_like(param).reshape(-1) if grad is None else grad.reshape(-1))
        return torch.cat(parts).detach().cpu()

    def _assign(self, shard: list[int], flat: torch.Tensor) -> None:
        values = flat.split([self.params[i].numel() for i in shard])
        with torch.no_grad():
            for i, value in zip(shard, values, strict=True):
                self.params[i].copy_(value.view_as(self.params[i]))

    def init_servers(self, optimizer: torch.optim.Optimizer, version: int) -> None:
        """Worker 0: hand each server its parameters, their optimizer state, the optimizer."""
        group_of = {}
        for g, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                group_of[id(p)] = g
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        for server, shard in zip(self.servers, self.shards, strict=True):
            params = [self.params[i].detach().cpu().clone() for i in shard]
            blob = {
                "optimizer": type(optimizer),
                "groups": hyper,
                "group_of": [group_of[id(self.params[i])] for i in shard],
                "params": params,
                "state": [_cpu(optimizer.state.get(self.params[i], {})) for i in shard],
                "version": version,
            }
            data = _to_bytes(blob)
            self.channel.send(server, _header(INIT, 0, data.numel()), data)

    def pull(self) -> None:
        for s, server in enumerate(self.servers):
            self.channel.send(server, _header(PULL, self.versions[s], 0))
        for s in range(len(self.servers)):
            self._reply(s)

    def _reply(self, s: int) -> None:
        """A server's answer: its parameters (and their version) when it sent them."""
        server, shard = self.servers[s], self.shards[s]
        header = self.channel.recv(server, torch.zeros(4, dtype=torch.int64))
        status, version, has_params, pushes = header.tolist()
        if s == 0:
            self.job_pushes = pushes
        if status == STOP:
            raise PeerLost(
                f"the parameter server (rank {server}) stopped training: a worker stopped or "
                "was lost (the server's log says which)"
            )
        if has_params:
            numel = sum(self.params[i].numel() for i in shard)
            flat = torch.empty(numel, dtype=self.params[shard[0]].dtype)
            self._assign(shard, self.channel.recv(server, flat))
            self.versions[s] = version  # what this worker's parameters now are

    def push(self, lrs: list[float], every: int) -> None:
        """Add this step's gradients; every `every` steps send their mean, take the reply."""
        grads = [self._gradients(shard) for shard in self.shards]
        if self.accumulated is None:
            self.accumulated = grads
        else:
            for total, grad in zip(self.accumulated, grads, strict=True):
                total.add_(grad)
        self.pushes += 1
        if self.pushes % every:
            return
        lr_tensor = torch.tensor(lrs, dtype=torch.float64)
        for s, (server, total) in enumerate(zip(self.servers, self.accumulated, strict=True)):
            header = _header(PUSH, self.versions[s], lr_tensor.numel())
            self.channel.send(server, header, lr_tensor, total.div_(every))
        for s in range(len(self.servers)):
            self._reply(s)
        self.accumulated = None

    def state(self) -> tuple[list[torch.Tensor], dict[int, dict]]:
        """The servers' parameters (copied into this worker's) and optimizer state, by index."""
        optimizer_state: dict[int, dict] = {}
        for s, (server, shard) in enumerate(zip(self.servers, self.shards, strict=True)):
            self.channel.send(server, _header(STATE, self.versions[s], 0))
            header = self.channel.recv(server, torch.zeros(4, dtype=torch.int64))
            status, version, nbytes, _ = header.tolist()
            blob = _from_bytes(self.channel.recv(server, torch.empty(nbytes, dtype=torch.uint8)))
            with torch.no_grad():
                for i, value in zip(shard, blob["params"], strict=True):
                    self.params[i].copy_(value)
            for i, state in zip(shard, blob["state"], strict=True):
                if state:
                    optimizer_state[i] = state
            self.versions[s] = version
        return dict(sorted(optimizer_state.items()))  # by index, as optimizer.state_dict()

    def meet(self, round_: int) -> list[int]:
        """Async: wait at the first server for the other live workers; their ranks."""
        server = self.servers[0]
        self.channel.send(server, _header(MEET, round_, 0))
        status, _, count, _ = self.channel.recv(server, torch.zeros(4, dtype=torch.int64)).tolist()
        if status == STOP:
            raise PeerLost(f"the parameter server (rank {server}) stopped training")
        return self.channel.recv(server, torch.empty(count, dtype=torch.int64)).tolist()

    def done(self, failed: bool = False) -> None:
        for server in self.servers:
            self.channel.send(server, _header(DONE, 0, int(failed)))


class JobEpoch:
    """Async mode's training batches of a worker: its own shard, gone round again if need be,
    until the servers have taken one epoch's pushes from all workers together. A fast worker
    thus trains on more batches and a slow one on fewer, and no worker waits for the others
    until the epoch ends, where they meet (`strategy.meet`). It has no length, so Lightning
    looks one batch ahead to see the epoch's last one. Everything else is the loader's."""

    def __init__(self, loader: Any, strategy: ParameterServerStrategy, pushes: int) -> None:
        self.loader, self.strategy, self.pushes_per_epoch = loader, strategy, pushes

    def __getattr__(self, name: str) -> Any:  # sampler, state_dict, ...: the loader's
        return getattr(self.loader, name)

    def __iter__(self):
        strategy, client = self.strategy, self.strategy.client
        target = strategy.epoch_end_pushes_for(self.pushes_per_epoch)
        strategy.stepping_alone = True
        while client.job_pushes < target:
            empty = True
            for batch in self.loader:
                empty = False
                if client.job_pushes >= target:
                    break
                yield batch
            if empty:
                break
        strategy.meet()
        # The workers step together again from their last batch of the epoch on. (Not in a
        # `finally`: Lightning sometimes starts an iterator and drops it, which closes it.)
        strategy.stepping_alone = False


def _cpu(state: dict) -> dict:
    return {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


class SharesRankZeroBuffers:
    """Every process validates and tests with rank 0's buffers (batch norm statistics), as a
    resumed run does with the checkpoint's: DDP's wrapper would broadcast them before a forward
    pass, and workers of a parameter server have none."""

    def on_validation_start(self) -> None:
        super().on_validation_start()
        self._share_rank_zero_buffers()

    def on_test_start(self) -> None:
        super().on_test_start()
        self._share_rank_zero_buffers()

    def _share_rank_zero_buffers(self) -> None:
        if self.world_size > 1:
            for buffer in self.lightning_module.buffers():
                torch.distributed.broadcast(buffer, src=0)


class _LostProcessObserver(_ChildProcessObserver):
    """Lightning's watch SIGKILLs all processes, this one too, within 5 s of one dying, without a
    word; this one first leaves `grace` seconds to name the lost one and stop."""

    grace = 10.0

    def _terminate_all(self) -> None:
        time.sleep(self.grace)
        super()._terminate_all()


class ReportingLauncher(_SubprocessScriptLauncher):
    """Lightning's launcher (its `launch`, copied), with `_LostProcessObserver` over the processes
    whose death ends the job (`ParameterServerStrategy.watched_processes`): async training goes
    on without a lost worker, which Lightning's watch would not allow. Private Lightning API:
    no public way sets a strategy's launcher or its watch (Lightning #17248, open; the watch came
    with #18218)."""

    def __init__(self, strategy: ParameterServerStrategy) -> None:
        super().__init__(strategy.cluster_environment, strategy.num_processes, strategy.num_nodes)
        self.strategy = strategy

    def launch(self, function, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        self.cluster_environment.validate_settings(self.num_processes, self.num_nodes)
        if not self.cluster_environment.creates_processes_externally:
            self._call_children_scripts()
            if watched := self.strategy.watched_processes(self.procs):
                _LostProcessObserver(main_pid=os.getpid(), child_processes=watched).start()
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)


class ParameterServerStrategy(
    ReportsLostProcesses, SharesRankZeroBuffers, PreparesRun, _LightningDDPStrategy
):
    """Lightning's DDP launcher and process group for the workers; servers instead of DDP's
    all-reduce (see the module's docstring). `trainer.devices × trainer.num_nodes` processes:
    the last `num_servers` serve, the rest train."""

    watches_started_processes = False  # its launcher's watch: async training loses workers

    def __init__(
        self,
        num_servers: PositiveInt = 1,
        mode: Literal["sync", "async"] = "sync",
        max_staleness: NonNegativeInt = 0,
        push_every: PositiveInt = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.num_servers, self.mode = num_servers, mode
        self.max_staleness, self.push_every = max_staleness, push_every
        self.client: ServerClient | None = None
        self._channel: _Channel | None = None
        self._server_state: dict[int, dict] | None = None
        self.members: list[int] | None = None  # the live workers' job ranks, once one is lost
        self.epoch_end_pushes, self._target_epoch = 0, -1  # async: epoch_end_pushes_for
        self._rounds = 0  # async: the meetings at the ends of epochs

    @classmethod
    def prepare_run(cls, cfg: DictConfig) -> None:
        check_parameter_server(cfg)

    # Async mode: between an epoch's first batch and validation, Lightning sees one process.
    # Its SIGTERM broadcast before every batch would make each step wait for the slowest
    # worker, and hang when their step counts differ.
    stepping_alone = False

    # Set here rather than in the cluster environment: SLURM's and torchrun's ignore setters.
    job_rank = 0

    # Lightning's world is the live workers: all of them unless one was lost in async mode.
    # Worker 0 always is (it holds the store the others meet in, and writes the checkpoints),
    # so it stays rank 0.
    @property
    def world_size(self) -> int:
        return 1 if self.stepping_alone else len(self.live_workers)

    @property
    def global_rank(self) -> int:
        if self.job_rank not in self.live_workers:  # a server
            return self.job_rank
        return self.live_workers.index(self.job_rank)

    @property
    def live_workers(self) -> list[int]:
        return list(range(self.num_workers)) if self.members is None else self.members

    def on_validation_start(self) -> None:
        self.stepping_alone = False  # all workers meet again here
        self._pull_when_async()
        super().on_validation_start()

    def on_train_end(self) -> None:
        self.stepping_alone = False
        self._pull_when_async()  # for testing the final weights
        super().on_train_end()

    def _pull_when_async(self) -> None:
        """Async workers evaluate the servers' parameters, not their own older copies: once
        every worker has pushed its last gradients (the barrier)."""
        if self.mode == "async" and self.client is not None and self.client.started:
            self.barrier()
            self.client.pull()

    @property
    def job_size(self) -> int:
        return self.num_nodes * self.num_processes

    @property
    def num_workers(self) -> int:
        return self.job_size - self.num_servers

    def set_world_ranks(self) -> None:
        # Lightning's world is the workers: ranks 0..num_workers-1 of the job.
        self.job_rank = self.node_rank * self.num_processes + self.local_rank
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.global_rank)
            self.cluster_environment.set_world_size(len(self.live_workers))
        rank_zero_only.rank = utils_rank_zero_only.rank = self.job_rank

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": len(self.live_workers), "rank": self.global_rank}

    def ended_processes(self) -> list[tuple[int, Any, int]]:
        """But the workers the job went on without: their loss was said when it happened."""
        gone = set(range(self.num_workers)) - set(self.live_workers)
        return [entry for entry in super().ended_processes() if entry[0] not in gone]

    def process_name(self, rank: int) -> str:
        if rank >= self.num_workers:
            return f"parameter server {rank - self.num_workers} (rank {rank})"
        return f"worker rank {rank}"

    def setup_distributed(self) -> None:
        from lightning.fabric.utilities.distributed import _init_dist_connection
        from lightning.fabric.utilities.seed import reset_seed

        self.set_world_ranks()
        if self.num_workers < 1:
            raise UserError(
                f"strategy=parameter_server with {self.job_size} process(es) and "
                f"strategy.num_servers={self.num_servers} leaves no worker: set trainer.devices "
                f"to {self.num_servers + 2} (2 workers), say."
            )
        if self.job_rank >= self.num_workers:
            self._serve_and_exit()
        if not dist.is_initialized():  # the workers' own group, ranks and size given
            reset_seed()  # as Lightning's DDP: every process from the same seed
            self._process_group_backend = self._get_process_group_backend()
            device = self.root_device
            _init_dist_connection(
                self.cluster_environment,
                self._process_group_backend,
                self.job_rank,
                self.num_workers,
                timeout=self._timeout,
                device_id=device if device.type != "cpu" else None,
            )
            # Kept: the workers form their group again in it when one is lost (async), and
            # on rank 0 it would go with the group it started for.
            self._store = dist.distributed_c10d._get_default_store()
        if self._channel is None:  # once per process (Lightning sets up for each stage)
            self._channel = _Channel(connect(self.job_rank, self.job_size, self._timeout))
            self._servers = list(range(self.num_workers, self.job_size))

    def epoch_end_pushes_for(self, pushes_per_epoch: int) -> int:
        """Async: the servers' push count (from 0 in this process) that ends this epoch. Kept
        here, not by the loader: Lightning may start an epoch's iterator twice, and a new loader
        (after a worker was lost) goes on from it."""
        epoch = self.lightning_module.trainer.current_epoch
        if self._target_epoch != epoch:
            self._target_epoch = epoch
            self.epoch_end_pushes += pushes_per_epoch
        return self.epoch_end_pushes

    def meet(self) -> None:
        """Async, at the end of each epoch: the workers wait for each other at the first server,
        which says who is left; without a lost worker they form their process group again,
        and reload their data for the new split (validation and the next epoch)."""
        self._rounds += 1
        members = self.client.meet(self._rounds)
        if members == self.live_workers:
            return
        lost = sorted(set(self.live_workers) - set(members))
        dist.destroy_process_group()
        dist.init_process_group(
            self._process_group_backend,
            store=dist.PrefixStore(f"litforge/workers/{self._rounds}", self._store),
            rank=members.index(self.job_rank),
            world_size=len(members),
            timeout=self._timeout,
        )
        self.members = members
        trainer = self.lightning_module.trainer
        trainer.fit_loop._combined_loader = None  # Lightning asks for loaders again
        trainer.fit_loop.epoch_loop.val_loop._combined_loader = None
        if self.global_rank == 0:
            log.warning(
                "worker rank(s) %s lost: asynchronous training goes on with worker rank(s) %s "
                "(%d of %d), the data split over them from here on.",
                ", ".join(map(str, lost)),
                ", ".join(map(str, members)),
                len(members),
                self.num_workers,
            )

    def _serve_and_exit(self) -> None:
        """A server process never returns to Lightning: it serves until the workers are done,
        then exits with the status the job should see."""
        # The job's SIGTERM (a scheduler's notice) is for the workers, which save a checkpoint
        # from the servers' state: a server ends when its workers are done or gone.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        index = self.job_rank - self.num_workers
        channel = _Channel(connect(self.job_rank, self.job_size, self._timeout))
        workers = list(range(self.num_workers))
        log.info(
            "parameter server %d (rank %d): %s mode for worker rank(s) %s",
            index,
            self.job_rank,
            self.mode,
            ", ".join(map(str, workers)),
        )
        status = Server(channel, index, workers, self.mode, self.max_staleness).run()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if type(self._launcher) is _SubprocessScriptLauncher:  # `python train.py` starts them
            self._launcher = ReportingLauncher(self)

    def watched_processes(self, children: list) -> list:
        """The processes this one started whose death ends the job (`ReportingLauncher`). Async
        training goes on without a lost worker: only a server's death ends it."""
        if self.mode != "async":
            return children
        first = self.node_rank * self.num_processes + 1  # the children's job ranks
        return [p for rank, p in enumerate(children, start=first) if rank >= self.num_workers]

    def configure_ddp(self) -> None:
        pass  # no DDP wrapper and no all-reduce: the servers reduce the gradients

    def setup(self, trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        if len(self.optimizers) != 1:
            raise RuntimeError(
                f"strategy=parameter_server serves one optimizer; the module has "
                f"{len(self.optimizers)}."
            )
        optimizer = self.optimizers[0]
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.client = ServerClient(self._channel, self._servers, params)
        optimizer.step = self._step_on_servers(optimizer)  # this instance's step only

    def _step_on_servers(self, optimizer: torch.optim.Optimizer):
        def step(closure=None):
            loss = closure() if closure is not None else None  # backward, clipping hooks
            self.client.push([g["lr"] for g in optimizer.param_groups], self.push_every)
            optimizer._opt_called = True  # what torch's own step tells its schedulers
            return loss

        step._wrapped_by_lr_sched = True  # schedulers check for it (a replaced step: warning)
        return step

    def on_train_start(self) -> None:
        super().on_train_start()
        if self.client is None:
            return
        if self.global_rank == 0:
            # The module's weights and optimizer state as Lightning set them up, or restored
            # them from `ckpt_path`: the servers start from these.
            self.client.init_servers(self.optimizers[0], self.lightning_module.global_step)
        self.optimizers[0].state.clear()  # the servers' now; a worker never steps it
        self.client.pull()
        self.client.started = True

    def process_dataloader(self, dataloader: Any) -> Any:
        dataloader = super().process_dataloader(dataloader)
        trainer = self.lightning_module.trainer
        if self.mode != "async" or self.client is None or not trainer.training:
            return dataloader
        batches = len(dataloader)  # this worker's shard, as far as limit_train_batches goes
        limit = trainer.limit_train_batches
        batches = min(batches, limit) if isinstance(limit, int) else int(batches * limit)
        pushes = batches // trainer.accumulate_grad_batches // self.push_every
        return JobEpoch(dataloader, self, pushes * len(self.live_workers)) if pushes else dataloader

    def lightning_module_state_dict(self) -> dict[str, Any]:
        if self.client is not None and self.global_rank == 0:
            self._server_state = self.client.state()  # and the servers' parameters, copied in
        return super().lightning_module_state_dict()

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        state = optimizer.state_dict()
        if self._server_state is not None:  # the single-device format, from the servers
            state["state"] = self._server_state
            self._server_state = None
        return state

    def teardown(self) -> None:
        # A worker stopped by an error says so: in sync mode the others then stop too, instead
        # of waiting for its next push (its own error line says why).
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if self.client is not None:
            with contextlib.suppress(RuntimeError):  # a server gone: the error says why
                self.client.done(failed=trainer is None or trainer.interrupted)
        self.client = None
        super().teardown()


def check_parameter_server(cfg: DictConfig) -> None:
    """What `strategy=parameter_server` needs, named by config keys."""
    trainer, strategy = cfg.trainer, cfg.strategy
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and restarts > 0:
        # Its groups meet in the store torchrun's agent keeps across restarts: restarted
        # workers would look for the dead workers' addresses there (pytorch #135712).
        raise UserError(
            "strategy=parameter_server does not survive torchrun --max-restarts: use "
            "strategy=ddp, or start torchrun with "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1."
        )
    if isinstance(trainer.devices, int):
        processes = trainer.devices * trainer.num_nodes
        if processes <= strategy.num_servers:
            raise UserError(
                f"strategy=parameter_server with strategy.num_servers={strategy.num_servers} "
                f"needs more processes than servers: trainer.devices x trainer.num_nodes is "
                f"{processes}. Set trainer.devices={strategy.num_servers + 2} (2 workers), say."
            )
    unsupported = {
        # a worker could clip only its own gradients, not what the servers apply
        "trainer.gradient_clip_val": trainer.get("gradient_clip_val"),
        # the loss scaler would step a local optimizer, which the servers replace
        "trainer.precision=16-mixed": str(trainer.precision) == "16-mixed",
    }
    for setting, used in unsupported.items():
        if used:
            raise UserError(
                f"{setting} is not supported with strategy=parameter_server (the servers step "
                f"the optimizer). Remove it, or use strategy=ddp."
            )
    if strategy.mode != "async":
        return
    limit = trainer.get("limit_train_batches")
    every_n = OmegaConf.select(cfg, "callbacks.last_checkpoint.every_n_train_steps", default=None)
    # Async workers run different numbers of batches, with nothing in common between an epoch's
    # first and last: what acts among them during an epoch would wait or mismatch.
    during_epoch = {
        "trainer.max_time": trainer.get("max_time"),
        "callbacks.last_checkpoint.every_n_train_steps": every_n,
        "trainer.val_check_interval": trainer.get("val_check_interval") not in (None, 1, 1.0),
        "a fraction as trainer.limit_train_batches": isinstance(limit, float) and limit < 1,
    }
    for setting, used in during_epoch.items():
        if used:
            raise UserError(
                f"{setting} is not supported with strategy.mode=async: it acts during an epoch, "
                f"when async workers share nothing. Remove it, or use strategy.mode=sync."
            )
