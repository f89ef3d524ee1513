"""DDP with its gradient communication hook on every device, and how a strategy (the feature
folders' too) names a lost process in one line (`ReportsLostProcesses`). What else the pipeline
calls on a strategy: docs/architecture.md, "What the pipeline calls"."""

import contextlib
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import lightning.pytorch.strategies
import torch

from litforge.checkpoints import how_to_resume
from litforge.console import quiet_lightning
from litforge.errors import UserError

log = logging.getLogger(__name__)
# A process DDP spawns (strategy=ddp_spawn) imports this module with the strategy it unpickles,
# and no other of the pipeline's: Lightning's warnings are quietened there too.
quiet_lightning()
# What gloo and NCCL say when a peer is gone; "pair closure": a hung peer (a plain RuntimeError).
COMMUNICATION_ERRORS = ("gloo", "NCCL", "Connection reset", "Connection closed", "pair closure")
_FIRST_DEATH = threading.Lock()


class ReportsLostProcesses:
    """`lost_process(exception)`: the line `pipeline.fit` ends the job with when a process of it
    was lost, naming that process rather than the communication error it left behind (gloo:
    "Connection reset by peer"); None for any other error. Worked out in `on_exception` (the
    Strategy's hook), before Lightning stops the processes this one started. A hung process is
    bounded by the strategy's `timeout`.

    Under Lightning's own launcher (`python train.py` with several devices), Lightning's watch
    over the processes this one started SIGKILLs the whole job within 5 s of one dying, which
    may cut that line off: a thread waiting on each of them logs one killed by a signal
    (SIGKILL, the OOM killer, a crash) the moment it dies. A strategy that goes on without some
    processes sets `watches_started_processes = False`. Under a cluster launcher that starts
    every process itself nothing races the line."""

    lost_line: str | None = None  # set by on_exception when a process of the job was lost
    _stopping = False  # a death was said, or this process kills the others (Ctrl+C)
    watches_started_processes = True
    _watched: frozenset[int] = frozenset()  # the pids watched

    def setup(self, trainer) -> None:
        super().setup(trainer)
        if not self.watches_started_processes or not hasattr(os, "waitid"):  # (not on macOS)
            return
        for child in getattr(self.launcher, "procs", None) or []:  # started by this process
            if child.pid not in self._watched:  # (fit, then test: set up again)
                self._watched |= {child.pid}
                threading.Thread(target=self._watch, args=(child,), daemon=True).start()

    def _watch(self, child: subprocess.Popen) -> None:
        # Woken by the death itself, so it is said before Lightning's watch polls (every 5 s).
        # WNOWAIT: the status stays for `poll` (Lightning's, `lost_process`). Not said: an exit
        # with a status of its own (that process said why), a SIGTERM or SIGINT (asked to stop,
        # as the job was), the processes this one kills on Ctrl+C, and any death after the first.
        try:
            death = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # already reaped
            return
        if death is None or death.si_code == os.CLD_EXITED:
            return
        how = signal.Signals(death.si_status)
        with _FIRST_DEATH:
            if self._stopping or how in (signal.SIGTERM, signal.SIGINT):
                return
            self._stopping = True
        rank = self.node_rank * self.num_processes + 1 + self.launcher.procs.index(child)
        log.error(f"The process of {self.process_name(rank)} (pid {child.pid}) died (killed by "
                  f"{how.name}): the job stops.")  # fmt: skip

    def on_exception(self, exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt):  # Lightning then SIGKILLs the others
            with _FIRST_DEATH:
                self._stopping = True
        super().on_exception(exception)
        self.lost_line = self.lost_process(exception)

    def lost_process(self, exception: BaseException) -> str | None:
        if self.lost_line:
            return self.lost_line
        dead = self.ended_processes()
        communication = any(
            _is_communication_error(e) for e in (exception, exception.__context__) if e
        )
        if communication and not dead and getattr(self.launcher, "procs", None):
            # A killed peer's sockets close before its exit can be seen: a moment for it to end.
            deadline = time.monotonic() + 2
            while not dead and time.monotonic() < deadline:
                time.sleep(0.05)
                dead = self.ended_processes()
        # Killed from outside first: an exit 1 or NCCL's abort (SIGABRT) may be a reaction to it.
        dead.sort(key=lambda entry: entry[2] > 0 or entry[2] == -signal.SIGABRT)
        if dead:
            rank, process, code = dead[0]
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
            return (
                f"the process of {self.process_name(rank)} (pid {process.pid}) died ({how}), "
                f"so the job stopped. Its own output above says why; {how_to_resume()}."
            )
        if communication:
            return (
                f"rank {self.global_rank} lost contact with the other processes of the job "
                f"({_what_failed(exception)}); one of them stopped or died: {how_to_resume()}."
            )
        return None

    def ended_processes(self) -> list[tuple[int, subprocess.Popen, int]]:
        """(rank, process, exit status) of each process this one started that has ended with
        an error: those a lost-process line may name."""
        children = getattr(self.launcher, "procs", None) or []  # started by this process
        first = self.node_rank * self.num_processes + 1
        return [(r, p, code) for r, p in enumerate(children, start=first) if (code := p.poll())]

    def process_name(self, rank: int) -> str:
        return f"rank {rank}"


@contextlib.contextmanager
def lost_process_ends_the_job(strategy: object) -> Iterator[None]:
    """Around `trainer.fit`: an error that the strategy's `lost_process` names ends the job in that
    line (a UserError). torchrun SIGTERMs the surviving processes when one dies; once this process
    knows of a lost one (its `on_exception`, before Lightning puts back the SIGTERM handler it
    found: this one), a SIGTERM waits for the line. Any other SIGTERM does what it did before."""
    if not isinstance(strategy, ReportsLostProcesses):
        yield
        return

    def on_sigterm(signum: int, frame: object) -> None:
        if signal.getsignal(signal.SIGTERM) is not on_sigterm:  # Lightning's handler calls it
            if callable(previous):  # (as it would have called that one)
                previous(signum, frame)
        elif strategy.lost_line is None:
            signal.signal(signal.SIGTERM, previous)
            os.kill(os.getpid(), signal.SIGTERM)

    main = threading.current_thread() is threading.main_thread()  # (where signals are handled)
    # (None: a handler not set from Python, which cannot be put back)
    previous = (signal.getsignal(signal.SIGTERM) or signal.SIG_DFL) if main else None
    if main:
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except Exception as err:
        if lost := strategy.lost_process(err):
            if main:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the line first
            raise UserError(lost) from err
        raise
    finally:
        if main and signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, previous)


def _what_failed(exception: BaseException) -> str:
    """Its first sentence, without gloo's source location."""
    text = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", str(exception)).strip()
    first_line = text.splitlines()[0] if text else type(exception).__name__
    return re.split(r"(?<=[a-z])\. ", first_line)[0][:200]


def _is_communication_error(exception: BaseException) -> bool:
    return isinstance(exception, torch.distributed.DistError) or any(
        marker in str(exception) for marker in COMMUNICATION_ERRORS
    )


class DDPStrategy(ReportsLostProcesses, lightning.pytorch.strategies.DDPStrategy):
    """Lightning (2.6.6) registers `ddp_comm_hook` (fp16, bf16, PowerSGD) only on CUDA and drops
    it silently otherwise; torch runs these hooks on gloo too: registered here once the model is
    wrapped (`configure_ddp`), with torch's `DistributedDataParallel.register_comm_hook`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.comm_state = kwargs.get("ddp_comm_state")
        self.comm_hook = kwargs.get("ddp_comm_hook")
        self.comm_wrapper = kwargs.get("ddp_comm_wrapper")

    def configure_ddp(self) -> None:
        super().configure_ddp()  # on CUDA, Lightning registers the hook (wrappers included)
        if self.comm_hook is None:
            return
        if self.root_device.type != "cuda":
            wrap = self.comm_wrapper
            hook = self.comm_hook if wrap is None else wrap(self.comm_hook)
            self.model.register_comm_hook(self.comm_state, hook)
        if self.global_rank == 0:
            log.info("DDP gradient communication hook attached: %s", _name(self.comm_hook))


def _name(hook) -> str:
    return getattr(hook, "__name__", None) or type(hook).__name__
