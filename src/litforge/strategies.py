"""Strategy classes of our own, where Lightning's need a change, and the checks that turn a
strategy that cannot work on this machine into one clear line before anything launches."""

from __future__ import annotations

import logging
import signal

import torch
from lightning.pytorch.strategies import DDPStrategy as _LightningDDPStrategy
from lightning.pytorch.strategies import ModelParallelStrategy as _LightningModelParallelStrategy
from omegaconf import DictConfig

from litforge.errors import UserError

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

    Lightning registers `ddp_comm_hook` (gradient compression: fp16, bf16, PowerSGD) only when
    training on CUDA and silently drops it otherwise; torch runs these hooks on gloo too.
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
    parallelism leaves of all processes (Lightning's own "auto" is the number of nodes)."""

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


def accelerator_is_cpu(accelerator: str) -> bool:
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def check_strategy(cfg: DictConfig) -> None:
    """Refuse combinations that cannot run here, with the fix, before any process starts."""
    trainer, strategy = cfg.trainer, cfg.strategy
    target = str(strategy.get("_target_", strategy.get("name", "")))
    on_cpu = accelerator_is_cpu(str(trainer.accelerator))
    devices = trainer.devices
    if on_cpu and target.endswith("FSDPStrategy"):
        raise UserError(
            "strategy=fsdp needs GPUs (Lightning's FSDPStrategy refuses the CPU). On CPUs use "
            "strategy=model_parallel, which shards with FSDP2 on any device."
        )
    if on_cpu and "DeepSpeed" in target:
        raise UserError(
            "DeepSpeed needs GPUs. On CPUs use strategy=ddp or strategy=model_parallel."
        )
    if on_cpu and trainer.get("sync_batchnorm"):
        raise UserError(
            "trainer.sync_batchnorm=true works on GPUs only (torch's SyncBatchNorm). "
            "Remove it for CPU runs."
        )
    if target.endswith("ModelParallelStrategy"):
        if str(trainer.precision) == "16-mixed":
            raise UserError(
                "trainer.precision=16-mixed is not supported by strategy=model_parallel. "
                "Use bf16-mixed (or bf16-true, 32-true)."
            )
        dp, tp = strategy.data_parallel_size, strategy.tensor_parallel_size
        if isinstance(devices, int):
            world = devices * trainer.num_nodes
            dp_size, tp_size = mesh_sizes(dp, tp, devices, trainer.num_nodes)
            if dp_size * tp_size != world:
                raise UserError(
                    f"strategy.data_parallel_size={dp} x strategy.tensor_parallel_size={tp} "
                    f"must multiply to trainer.devices x trainer.num_nodes = {world}."
                )
            if tp_size > 1 and trainer.get("detect_anomaly"):
                raise UserError(
                    "trainer.detect_anomaly=true (set by debug=...) fails under tensor parallelism:"
                    " torch's DTensor cannot run its check. Add trainer.detect_anomaly=false."
                )
    if not on_cpu and isinstance(devices, int) and devices > torch.cuda.device_count():
        raise UserError(
            f"trainer.devices={devices}, but this machine has {torch.cuda.device_count()} GPU(s). "
            "Use fewer devices, or trainer.accelerator=cpu."
        )
