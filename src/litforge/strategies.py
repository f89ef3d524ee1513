"""DDP with its communication hook on every device; a lost process named in one line (for the
feature folders' strategies too). A strategy may check its settings (class method `prepare_run`)
and the model and checkpoint before its processes start (`check_fit(model, ckpt_path)`)."""

import logging
import os
import re
import signal
import time
from typing import Any

import torch
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.strategies import DDPStrategy as _LightningDDPStrategy
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

from litforge.runs import how_to_resume

log = logging.getLogger(__name__)
# What gloo and NCCL say when a peer is gone; "pair closure": a hung peer (a plain RuntimeError).
COMMUNICATION_ERRORS = ("gloo", "NCCL", "Connection reset", "Connection closed", "pair closure")


class ReportsLostProcesses:
    """`lost_process(exception)` names the lost process rather than the communication error it
    left behind (gloo: "Connection reset by peer"), worked out in `on_exception` before Lightning
    stops the processes this one started. A hung process is bounded by `timeout`."""

    _lost: str | None = None
    already_lost: frozenset[int] = frozenset()  # ranks the job went on without (parameter_server)

    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        self._lost = self.lost_process(exception)

    def lost_process(self, exception: BaseException) -> str | None:
        if self._lost:
            return self._lost
        children = getattr(self.launcher, "procs", None) or []  # started by this process
        dead = [
            (rank, process, code)
            for rank, process in enumerate(children, start=self.node_rank * self.num_processes + 1)
            if (code := process.poll()) and rank not in self.already_lost
        ]
        # Killed from outside first: an exit 1 or NCCL's abort (SIGABRT) may be a reaction to it.
        dead.sort(key=lambda entry: entry[2] > 0 or entry[2] == -signal.SIGABRT)
        if dead:
            rank, process, code = dead[0]
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
            return (
                f"the process of {self.process_name(rank)} (pid {process.pid}) died ({how}), "
                f"so the job stopped. Its own output above says why; {how_to_resume()}."
            )
        if any(_is_communication_error(e) for e in (exception, exception.__context__) if e):
            return (
                f"rank {self.global_rank} lost contact with the other processes of the job "
                f"({_what_failed(exception)}); one of them stopped or died: {how_to_resume()}."
            )
        return None

    def process_name(self, rank: int) -> str:
        return f"rank {rank}"

    def watched_processes(self, children: list) -> list:
        """The processes this one started whose death ends the job (ReportingLauncher)."""
        return children

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if type(self._launcher) is _SubprocessScriptLauncher:  # `python train.py` starts them
            self._launcher = ReportingLauncher(self)


class _LostProcessObserver(_ChildProcessObserver):
    """Lightning's watch SIGKILLs all processes, this one too, within 5 s of one dying, without a
    word; this one first leaves `grace` seconds to name the lost one and stop."""

    grace = 10.0

    def _terminate_all(self) -> None:
        time.sleep(self.grace)
        super()._terminate_all()


class ReportingLauncher(_SubprocessScriptLauncher):
    """Lightning's, with `_LostProcessObserver` over the processes the strategy says end the job."""

    def __init__(self, strategy: ReportsLostProcesses) -> None:
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


def _what_failed(exception: BaseException) -> str:
    """Its first sentence, without gloo's source location."""
    text = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", str(exception)).strip()
    first_line = text.splitlines()[0] if text else type(exception).__name__
    return re.split(r"(?<=[a-z])\. ", first_line)[0][:200]


def _is_communication_error(exception: BaseException) -> bool:
    return isinstance(exception, torch.distributed.DistError) or any(
        marker in str(exception) for marker in COMMUNICATION_ERRORS
    )


class DDPStrategy(ReportsLostProcesses, _LightningDDPStrategy):
    """Lightning (2.6.6) registers `ddp_comm_hook` (fp16, bf16, PowerSGD) only on CUDA and drops
    it silently otherwise; torch runs these hooks on gloo too."""

    def _register_ddp_hooks(self) -> None:
        if self._ddp_comm_hook is None:
            return
        if self.root_device.type == "cuda":  # Lightning's own path, wrappers included
            super()._register_ddp_hooks()
        else:
            self.model.register_comm_hook(self._ddp_comm_state, self._ddp_comm_hook)
        attached = self.model._get_ddp_logging_data().get("comm_hook", "none")
        if self.global_rank == 0:
            log.info("DDP gradient communication hook attached: %s", attached)
