"""Lightning strategies of our own, where Lightning's need a change (conf/strategy/ selects them).
How each model is sharded is `litforge.parallelize`; which combinations cannot run,
`litforge.checks`."""

from __future__ import annotations

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
from lightning.pytorch.strategies import ModelParallelStrategy as _LightningModelParallelStrategy
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

from litforge import elastic

log = logging.getLogger(__name__)


class ReportsLostProcesses:
    """When training fails in a multi-process job, say which process was lost rather than
    show the communication error it left behind (gloo: "Connection reset by peer").

    `lost_process(exception)` is the line: `pipeline.fit` raises it as one `error:` line. (It is
    worked out when Lightning calls `on_exception`, before it stops the processes this one
    started.) Processes that hang instead of dying are bounded by the strategy's `timeout`.
    """

    _lost: str | None = None
    already_lost: frozenset[int] = frozenset()  # ranks the job went on without (parameter_server)

    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        self._lost = self.lost_process(exception)

    def lost_process(self, exception: BaseException) -> str | None:
        if self._lost:
            return self._lost
        children = getattr(self.launcher, "procs", None) or []  # started by this process
        first_rank = self.node_rank * self.num_processes
        dead = [
            (first_rank + local_rank, process, process.poll())
            for local_rank, process in enumerate(children, start=1)
        ]
        dead = [(rank, p, code) for rank, p, code in dead if code and rank not in self.already_lost]
        # Killed from outside (SIGKILL, SIGTERM, ...) first: one that exited 1, or that NCCL's
        # watchdog aborted (SIGABRT), may have been reacting to that death.
        dead.sort(key=lambda entry: entry[2] > 0 or entry[2] == -signal.SIGABRT)
        if dead:
            rank, process, code = dead[0]
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
            return (
                f"the process of {self.process_name(rank)} (pid {process.pid}) died ({how}), "
                f"so the job stopped. Its own output above says why; {elastic.how_to_resume()}."
            )
        if any(_is_communication_error(e) for e in (exception, exception.__context__) if e):
            return (
                f"rank {self.global_rank} lost contact with the other processes of the job "
                f"({_what_failed(exception)}); one of them stopped or died: "
                f"{elastic.how_to_resume()}."
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
    """Lightning's watch over the processes a launcher started: within 5 s of one dying, it
    SIGKILLs them all and this process too, without a word. Here it first leaves this process
    `grace` seconds to name the lost one and stop by itself, which it does at once unless it
    hangs (a dead peer fails gloo's operations straight away)."""

    grace = 10.0

    def _terminate_all(self) -> None:
        time.sleep(self.grace)
        super()._terminate_all()


class ReportingLauncher(_SubprocessScriptLauncher):
    """Lightning's launcher for `python train.py` on one machine (it starts the job's other
    processes), with `_LostProcessObserver` over those the strategy says end the job."""

    def __init__(self, strategy: ReportsLostProcesses) -> None:
        super().__init__(strategy.cluster_environment, strategy.num_processes, strategy.num_nodes)
        self.strategy = strategy

    def launch(self, function, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        # Lightning's `launch`, with the watch above.
        self.cluster_environment.validate_settings(self.num_processes, self.num_nodes)
        if not self.cluster_environment.creates_processes_externally:
            self._call_children_scripts()
            if watched := self.strategy.watched_processes(self.procs):
                _LostProcessObserver(main_pid=os.getpid(), child_processes=watched).start()
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)


class SurvivesRestarts:
    """Under torchrun, the process group meets in `elastic.restart_safe_store`: the workers
    torchrun restarts after a failure find each other, not the addresses of the dead ones.
    (Lightning's own setup, which follows, finds the group made and keeps it.)"""

    def _init_restart_safe_process_group(self) -> None:
        from lightning.fabric.utilities.distributed import _init_dist_connection

        self.set_world_ranks()
        if torch.distributed.is_initialized():
            return
        store = elastic.restart_safe_store(self.global_rank, self.world_size, self._timeout)
        if store is None:
            return
        device = self.root_device
        _init_dist_connection(
            self.cluster_environment,
            self._get_process_group_backend(),
            timeout=self._timeout,
            store=store,
            device_id=device if device.type != "cpu" else None,
        )


def _what_failed(exception: BaseException) -> str:
    """The gist of a communication error: its first sentence, without gloo's source location."""
    text = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", str(exception)).strip()
    first = re.split(r"(?<=[a-z])\. ", text.splitlines()[0] if text else type(exception).__name__)[
        0
    ]
    return first[:200]


# What gloo and NCCL say when a peer is gone. "Application timeout caused pair closure": a
# peer that hangs, seen by a gloo operation waiting in the backward pass (a plain RuntimeError).
COMMUNICATION_ERRORS = ("gloo", "NCCL", "Connection reset", "Connection closed", "pair closure")


def _is_communication_error(exception: BaseException) -> bool:
    text = str(exception)
    return isinstance(exception, torch.distributed.DistError) or any(
        marker in text for marker in COMMUNICATION_ERRORS
    )


class DDPStrategy(ReportsLostProcesses, SurvivesRestarts, _LightningDDPStrategy):
    """Lightning's DDP, with its communication hook attached on every device.

    Lightning (2.6.6) registers `ddp_comm_hook` (gradient compression: fp16, bf16, PowerSGD) only
    when training on CUDA and silently drops it otherwise; torch runs these hooks on gloo too.
    """

    def setup_distributed(self) -> None:
        self._init_restart_safe_process_group()
        super().setup_distributed()

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


SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")  # torch.distributed.pipelining's


class ModelParallelStrategy(
    ReportsLostProcesses, SurvivesRestarts, _LightningModelParallelStrategy
):
    """Lightning's ModelParallelStrategy, with pipeline parallelism as a third mesh dimension.

    The device mesh is `pipeline_parallel` × `data_parallel` × `tensor_parallel` (Lightning's is
    the last two). `pipeline_parallel_size` > 1 splits the network into that many stages (how,
    per model: `litforge.parallelize`), each on its own processes, run by `schedule` over
    `microbatches` slices of each batch (default: 2 per stage). `data_parallel_size="auto"` is
    what the other two leave of all processes (Lightning's own "auto" is the number of nodes, by
    design: Lightning PR #19878).
    """

    def __init__(
        self,
        *args: Any,
        pipeline_parallel_size: int = 1,
        microbatches: int | None = None,
        schedule: str = "1f1b",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.pipeline_parallel_size = pipeline_parallel_size
        self.microbatches = microbatches or 2 * pipeline_parallel_size
        self.schedule = schedule

    pipeline = None  # litforge.stages.Stages, with pipeline_parallel_size > 1
    _compile = False
    _placed = False

    def connect(self, model) -> None:
        super().connect(model)
        # Placement compiles, between tensor parallelism and FSDP2 (litforge.parallelize): the
        # module must not compile its network first.
        self._compile = self._compile or getattr(model, "compile_net", False)
        model.compile_net = False

    def setup(self, trainer) -> None:
        # After the module's configure_model (channels-last weights), before Lightning moves
        # the sharded network and builds the optimizers over its parameters.
        module = self.lightning_module
        # A module with a `net` (ClassificationModule's) is placed here; another places itself
        # in its configure_model, as Lightning's documentation has it.
        if not self._placed and hasattr(module, "net"):
            self._placed = True
            if self.pipeline_parallel_size > 1:
                from litforge.stages import Stages

                self.pipeline = Stages(
                    module.net,
                    self.device_mesh,
                    self.schedule,
                    self.microbatches,
                    module.loss,
                    self.root_device,
                    compile=self._compile,
                )
            else:
                from litforge.parallelize import parallelize

                parallelize(module.net, self.device_mesh, compile=self._compile)
        super().setup(trainer)

    # --- pipeline steps: the schedule runs the forward and backward passes of all microbatches

    def on_train_start(self) -> None:
        super().on_train_start()
        if self.pipeline is not None:  # Lightning's zero_grad and backward: in training_step
            # (Private, as Lightning's own StochasticWeightAveraging uses it: no public switch.)
            self.lightning_module.trainer.fit_loop._skip_backward = True

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.pipeline is None:
            return super().training_step(*args, **kwargs)
        (images, labels), batch_idx, module = args[0], args[1], self.lightning_module
        if batch_idx % module.trainer.accumulate_grad_batches == 0:
            module.optimizers().zero_grad()
        logits, loss, labels = self.pipeline.train_step(images, labels)
        outputs = None
        if self.pipeline.last:
            outputs = {"batch_size": torch.tensor(0.0)}
            if logits is not None:
                outputs = module.step_statistics(logits, labels, loss)
                outputs = {k: v.detach().cpu() for k, v in outputs.items()}
                outputs["batch_size"] = torch.tensor(float(len(labels)))
        # Only the last stage has them: every process logs and shows the same (their averages
        # over all processes are the last stages' averages).
        return self.pipeline.from_last_stage(outputs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.pipeline is None:
            return super().validation_step(*args, **kwargs)
        return self._evaluate("val", *args)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.pipeline is None:
            return super().test_step(*args, **kwargs)
        return self._evaluate("test", *args)

    def _evaluate(self, stage: str, batch: Any, *args: Any) -> None:
        images, labels = batch
        logits = self.pipeline.forward(images, labels)
        if logits is not None:  # the last stage counts; the others' metrics stay empty
            self.lightning_module.update_metrics(stage, logits, labels)

    def _setup_distributed(self) -> None:
        self._init_restart_safe_process_group()
        super()._setup_distributed()

    def setup_environment(self) -> None:
        self._data_parallel_size, self._tensor_parallel_size = mesh_sizes(
            self._data_parallel_size,
            self._tensor_parallel_size,
            self.num_processes,
            self.num_nodes,
            self.pipeline_parallel_size,
        )
        if self.pipeline_parallel_size == 1:
            super().setup_environment()
            return
        from torch.distributed.device_mesh import init_device_mesh

        # Lightning's own steps, with a 3-D mesh in place of its 2-D one.
        super(_LightningModelParallelStrategy, self).setup_environment()
        self._setup_distributed()
        self._device_mesh = init_device_mesh(
            self.root_device.type,
            (self.pipeline_parallel_size, self._data_parallel_size, self._tensor_parallel_size),
            mesh_dim_names=("pipeline_parallel", "data_parallel", "tensor_parallel"),
        )
        self.lightning_module._device_mesh = self._device_mesh

    # Optimizer states, pipelined: one entry per parameter (its group's settings too), so that
    # the stages' entries sit side by side in one folder of shards. Lightning's layout keeps
    # one list of groups, which the stages would overwrite for each other.
    _FLAT_OPTIMIZER = {"flatten_optimizer_state_dict": True, "cpu_offload": True}

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        if self.pipeline_parallel_size == 1:
            return super().optimizer_state(optimizer)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        optimizer = getattr(optimizer, "_optimizer", optimizer)  # LightningOptimizer's
        options = StateDictOptions(**self._FLAT_OPTIMIZER)
        return get_optimizer_state_dict(self.model, optimizer, options=options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict:
        """Lightning's loading of a folder of shards, with flattened optimizer states."""
        if self.pipeline_parallel_size == 1:
            return super().load_checkpoint(checkpoint_path, weights_only)
        from pathlib import Path

        from lightning.fabric.strategies.model_parallel import (
            _METADATA_FILENAME,
            _distributed_checkpoint_load,
        )
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        path = Path(self.broadcast(checkpoint_path))
        model_state = {"state_dict": get_model_state_dict(self.model)}  # this stage's keys
        _distributed_checkpoint_load(model_state, path)
        self.model.load_state_dict(model_state["state_dict"])
        options = StateDictOptions(**self._FLAT_OPTIMIZER)
        for index, optimizer in enumerate(self.optimizers):
            key = f"optimizer_{index}"
            state = {key: get_optimizer_state_dict(self.model, optimizer, options=options)}
            _distributed_checkpoint_load(state, path)
            set_optimizer_state_dict(self.model, optimizer, state[key], options=options)
        return torch.load(path / _METADATA_FILENAME, weights_only=weights_only)


def mesh_sizes(
    dp: int | str, tp: int | str, per_node: int, num_nodes: int, pp: int = 1
) -> tuple[int, int]:
    """The (data parallel, tensor parallel) sizes of the device mesh. Tensor parallel "auto":
    all processes of a node (Lightning's rule); data parallel "auto": what pipeline and tensor
    parallelism leave of all processes."""
    tp_size = per_node if tp == "auto" else int(tp)
    dp_size = num_nodes * per_node // (tp_size * pp) if dp == "auto" else int(dp)
    return dp_size, tp_size
