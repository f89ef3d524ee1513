"""Lightning strategies of our own, where Lightning's need a change (conf/strategy/ selects them).
How each model is sharded is `litforge.parallelize`; which combinations cannot run,
`litforge.checks`."""

from __future__ import annotations

import logging
import signal

import torch
from lightning.pytorch.strategies import DDPStrategy as _LightningDDPStrategy
from lightning.pytorch.strategies import ModelParallelStrategy as _LightningModelParallelStrategy

log = logging.getLogger(__name__)


class ReportsLostProcesses:
    """When training fails in a multi-process job, say which process was lost rather than
    show the communication error it left behind (gloo: "Connection reset by peer").

    `lost_process` is set in `on_exception`, which Lightning calls before it stops the other
    processes; `pipeline.fit` turns it into one `error:` line. Processes that hang instead of
    dying are bounded by the strategy's `timeout`.
    """

    lost_process: str | None = None

    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        children = getattr(self.launcher, "procs", None) or []  # started by this process
        for local_rank, process in enumerate(children, start=1):
            code = process.poll()
            if code:
                rank = self.node_rank * self.num_processes + local_rank
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
                self.lost_process = (
                    f"the process of rank {rank} (pid {process.pid}) died ({how}), so the "
                    f"job stopped. Its own output above says why; resume with ckpt_path=last."
                )
                return
        if _is_communication_error(exception):
            self.lost_process = (
                f"rank {self.global_rank} lost contact with the other processes of the job "
                f"({str(exception).splitlines()[0][:200]}); one of them stopped or died. "
                f"Resume with ckpt_path=last."
            )


def _is_communication_error(exception: BaseException) -> bool:
    text = str(exception)
    return isinstance(exception, torch.distributed.DistError) or any(
        marker in text for marker in ("gloo", "NCCL", "Connection reset", "Connection closed")
    )


class DDPStrategy(ReportsLostProcesses, _LightningDDPStrategy):
    """Lightning's DDP, with its communication hook attached on every device.

    Lightning (2.6.6) registers `ddp_comm_hook` (gradient compression: fp16, bf16, PowerSGD) only
    when training on CUDA and silently drops it otherwise; torch runs these hooks on gloo too.
    """

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


class ModelParallelStrategy(ReportsLostProcesses, _LightningModelParallelStrategy):
    """Lightning's ModelParallelStrategy where `data_parallel_size="auto"` means what tensor
    parallelism leaves of all processes (Lightning's own "auto" is the number of nodes, by
    design: Lightning PR #19878)."""

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":
            self._data_parallel_size, _ = mesh_sizes(
                "auto", self._tensor_parallel_size, self.num_processes, self.num_nodes
            )
        super().setup_environment()


def mesh_sizes(dp: int | str, tp: int | str, per_node: int, num_nodes: int) -> tuple[int, int]:
    """The (data parallel, tensor parallel) sizes of the device mesh. Tensor parallel "auto":
    all processes of a node (Lightning's rule); data parallel "auto": what tensor parallelism
    leaves of all processes."""
    tp_size = per_node if tp == "auto" else int(tp)
    dp_size = num_nodes * per_node // tp_size if dp == "auto" else int(dp)
    return dp_size, tp_size
