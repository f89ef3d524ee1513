"""`strategy=model_parallel`: Lightning's ModelParallelStrategy (FSDP2 and tensor parallelism over
a device mesh) with pipeline parallelism as a third mesh dimension. How each network is sharded:
`parallelize.py`; how it is split into pipeline stages and run: `stages.py`. What cannot run is
refused from the config (`prepare_run`) and the model (`check_fit`) before anything starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.strategies import ModelParallelStrategy as _LightningModelParallelStrategy
from omegaconf import DictConfig, OmegaConf

from litforge.errors import UserError
from litforge.hooks import ChecksFit, PreparesRun
from litforge.model_parallel.parallelize import count_blocks, has_plan, parallelize
from litforge.model_parallel.shards import read_meta
from litforge.model_parallel.stages import Stages, num_stages
from litforge.settings import PositiveInt
from litforge.strategies import ReportsLostProcesses


class ModelParallelStrategy(
    ReportsLostProcesses, PreparesRun, ChecksFit, _LightningModelParallelStrategy
):
    """Lightning's ModelParallelStrategy, with pipeline parallelism as a third mesh dimension.

    The device mesh is `pipeline_parallel` × `data_parallel` × `tensor_parallel` (Lightning's is
    the last two). `pipeline_parallel_size` > 1 splits the network into that many stages (how,
    per model: `parallelize.py`), each on its own processes, run by `schedule` over
    `microbatches` slices of each batch (default: 2 per stage). `data_parallel_size="auto"` is
    what the other two leave of all processes (Lightning's own "auto" is the number of nodes, by
    design: Lightning PR #19878).
    """

    def __init__(
        self,
        *args: Any,
        pipeline_parallel_size: PositiveInt = 1,
        microbatches: PositiveInt | None = None,
        schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = "1f1b",  # stages.SCHEDULES
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.pipeline_parallel_size = pipeline_parallel_size
        self.microbatches = microbatches or 2 * pipeline_parallel_size
        self.schedule = schedule

    @classmethod
    def prepare_run(cls, cfg: DictConfig) -> None:
        """Sizes, precision and settings that cannot run, named by their config keys."""
        check_model_parallel(cfg)

    def check_fit(self, model: Any, ckpt_path: str | None) -> None:
        """A network without a plan of its own split; more stages than the network has blocks;
        a pipeline resuming from one file; a folder of shards to resume from that is not whole
        or whose `meta.pt` fails the checks of a checkpoint file (`shards.read_meta`)."""
        if ckpt_path and Path(ckpt_path).is_dir():  # (`load_checkpoint` checks it again)
            read_meta(ckpt_path)
        pp, net = self.pipeline_parallel_size, getattr(model, "net", None)
        sizes = self._data_parallel_size, self._tensor_parallel_size
        _, tp = mesh_sizes(*sizes, self.num_processes, self.num_nodes, pp)
        if net is not None and not has_plan(net) and (tp > 1 or pp > 1):
            raise UserError(
                f"model_parallel: {type(net).__name__} has no tensor/pipeline plan: use "
                f"strategy.tensor_parallel_size=1 and strategy.pipeline_parallel_size=1 (data "
                f"parallelism with FSDP2), or add a plan in "
                f"src/litforge/model_parallel/parallelize.py (docs/model_parallel.md)."
            )
        if pp <= 1:
            return
        if net is None or not callable(getattr(model, "loss", None)):
            raise UserError(
                f"model_parallel: pipeline stages split a module's `net` and compute its "
                f"`loss(logits, labels)`, and {type(model).__name__} lacks one: use "
                f"strategy.pipeline_parallel_size=1."
            )
        stages, blocks = num_stages(pp, self.schedule), count_blocks(model.net)
        if stages > blocks:
            raise UserError(
                f"strategy.pipeline_parallel_size={pp} with strategy.schedule={self.schedule} "
                f"needs {stages} stages, but {type(model.net).__name__} has {blocks} blocks to "
                f"split: use fewer stages or a deeper network."
            )
        if ckpt_path and not Path(ckpt_path).is_dir():  # ckpt_path: what a fit resumes from
            raise UserError(
                f"{ckpt_path} is one file: a pipeline run resumes from a folder of shards that a "
                f"run of the same sizes wrote (strategy.save_distributed_checkpoint=true)."
            )

    pipeline = None  # stages.Stages, with pipeline_parallel_size > 1
    _compile = False
    _placed = False

    def connect(self, model) -> None:
        super().connect(model)
        # Placement compiles, between tensor parallelism and FSDP2 (parallelize.py): the module
        # must not compile its network first.
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
        # The schedule runs the forward and backward passes with the module's `loss`; then
        # every stage runs the module's own step on the last stage's logits, which logs.
        logits, _, labels = self.pipeline.train_step(images, labels)
        logits = self.pipeline.from_last_stage(logits)
        if logits is None:  # a batch too small for the microbatches
            return None
        with forward_gives(module, logits):
            return super().training_step((images[: len(labels)], labels), batch_idx)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.pipeline is None:
            return super().validation_step(*args, **kwargs)
        return self._evaluate(super().validation_step, *args)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.pipeline is None:
            return super().test_step(*args, **kwargs)
        return self._evaluate(super().test_step, *args)

    def _evaluate(self, step: Any, batch: Any, *args: Any) -> Any:
        images, labels = batch
        logits = self.pipeline.from_last_stage(self.pipeline.forward(images, labels))
        with forward_gives(self.lightning_module, logits):
            return step(batch, *args)

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
        """Lightning's loading of a folder of shards (resuming, or testing with train=false),
        its `meta.pt` checked first as the core checks a checkpoint file (`shards.read_meta`);
        with pipeline stages, flattened optimizer states."""
        path = Path(self.broadcast(checkpoint_path))  # rank 0's, as Lightning reads it
        if path.is_dir():  # (a file: the core's `checkpoints.read` checked it before)
            read_meta(path)
        if self.pipeline_parallel_size == 1:
            return super().load_checkpoint(path, weights_only)
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


def check_pipeline(cfg: DictConfig) -> None:
    """What `strategy.pipeline_parallel_size` > 1 cannot run with (see stages.py)."""
    trainer, strategy = cfg.trainer, cfg.strategy
    pp, schedule = strategy.pipeline_parallel_size, strategy.schedule
    microbatches = strategy.get("microbatches") or 2 * pp  # (each alone: their annotations)
    batch = cfg.get("data", {}).get("batch_size")
    if isinstance(batch, int) and batch % microbatches:
        raise UserError(
            f"strategy.microbatches={microbatches} does not divide data.batch_size={batch}: "
            f"choose a batch size that is a multiple of it, or other microbatches."
        )
    if schedule != "gpipe" and microbatches < pp:
        raise UserError(
            f"strategy.schedule={schedule} needs at least one microbatch per stage: set "
            f"strategy.microbatches to {pp} or more (it is {microbatches})."
        )
    if schedule == "interleaved_1f1b" and microbatches % pp:
        raise UserError(
            f"strategy.schedule=interleaved_1f1b needs strategy.microbatches ({microbatches}) "
            f"to be a multiple of strategy.pipeline_parallel_size ({pp})."
        )
    scheduler = str(OmegaConf.select(cfg, "model.scheduler._target_", default="") or "")
    unsupported = {
        "model.scheduler=ReduceLROnPlateau": scheduler.endswith("ReduceLROnPlateau"),
        "trainer.gradient_clip_val": trainer.get("gradient_clip_val"),
        "trainer.accumulate_grad_batches": (trainer.get("accumulate_grad_batches") or 1) > 1,
        "trainer.detect_anomaly": trainer.get("detect_anomaly"),
        f"trainer.precision={trainer.precision}": str(trainer.precision) not in ("32", "32-true"),
        "model.net.mirror_average": OmegaConf.select(cfg, "model.net.mirror_average"),
    }
    for setting, used in unsupported.items():
        if used:
            raise UserError(
                f"{setting} is not supported with strategy.pipeline_parallel_size={pp} (the "
                f"pipeline schedule runs the forward and backward passes itself). "
                f"Remove it, or train without the pipeline; strategy.microbatches already "
                f"accumulates gradients."
            )
    if not strategy.save_distributed_checkpoint:
        raise UserError(
            "strategy.save_distributed_checkpoint=false is not supported with "
            "strategy.pipeline_parallel_size>1: each stage saves its own shards (`python -m "
            "litforge.model_parallel to-file` puts them together into one file)."
        )


def check_model_parallel(cfg: DictConfig) -> None:
    trainer, strategy = cfg.trainer, cfg.strategy
    if str(trainer.precision) == "16-mixed":
        raise UserError(
            "trainer.precision=16-mixed is not supported by strategy=model_parallel. "
            "Use bf16-mixed (or bf16-true, 32-true)."
        )
    dp, tp = strategy.data_parallel_size, strategy.tensor_parallel_size
    pp = strategy.get("pipeline_parallel_size", 1)
    if pp != 1:
        check_pipeline(cfg)
    devices = trainer.devices
    if isinstance(devices, int):
        world = devices * trainer.num_nodes
        dp_size, tp_size = mesh_sizes(dp, tp, devices, trainer.num_nodes, pp)
        if pp * dp_size * tp_size != world or dp_size < 1:
            raise UserError(
                f"strategy.pipeline_parallel_size={pp} x strategy.data_parallel_size={dp} x "
                f"strategy.tensor_parallel_size={tp} must multiply to trainer.devices x "
                f"trainer.num_nodes = {world}."
            )
        if tp_size > 1 and trainer.get("detect_anomaly"):
            raise UserError(
                "trainer.detect_anomaly=true (set by debug=...) fails under tensor parallelism:"
                " torch's DTensor cannot run its check. Add trainer.detect_anomaly=false."
            )


@contextlib.contextmanager
def forward_gives(module: torch.nn.Module, logits: torch.Tensor) -> Iterator[None]:
    """`module(x)` returns `logits` (the pipeline's, computed already) for the module's own
    steps to log from: the step needs no change to run under pipeline stages."""
    module.forward = lambda *args, **kwargs: logits
    try:
        yield
    finally:
        del module.forward
