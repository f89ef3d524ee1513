"""Config checks, in one place and with the config keys in their messages, run before any data is
read or any process is launched. The classes check their own arguments too (in their own words,
for use without Hydra); what can only be known from the data (a validation split larger than the
dataset) is left to them.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from litforge.errors import UserError, number_problem

# key: (integer, minimum, above)
NUMBERS = {
    "model.optimizer.lr": (False, 0, True),
    "model.optimizer.weight_decay": (False, 0, False),
    "data.batch_size": (True, 1, False),
    "data.val_size": (True, 0, False),
    "data.crop_padding": (True, 0, False),
    "data.num_workers": (True, 0, False),
    "trainer.max_epochs": (True, -1, False),
    "trainer.accumulate_grad_batches": (True, 1, False),
}


def check_config(cfg: DictConfig, needs_checkpoint: bool = False) -> None:
    """Raise a UserError naming the first config value that cannot work."""
    for key, (integer, minimum, above) in NUMBERS.items():
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None:
            problem = number_problem(key, value, integer=integer, minimum=minimum, above=above)
            if problem:
                raise UserError(f"{problem} Set {key}=...")
    if cfg.get("optimized_metric_mode", "max") not in ("max", "min"):
        raise UserError(
            f"optimized_metric_mode={cfg.optimized_metric_mode} is neither max nor min. "
            f"Set optimized_metric_mode=max (higher is better) or min."
        )
    if needs_checkpoint and not cfg.get("ckpt_path"):
        raise UserError(
            "no checkpoint given: add ckpt_path=<file or folder>, e.g. "
            "logs/train/runs/<run>/checkpoints/last.ckpt"
        )
    if "trainer" in cfg and "strategy" in cfg:
        check_strategy(cfg)


def check_pipeline(cfg: DictConfig) -> None:
    """What `strategy.pipeline_parallel_size` > 1 cannot run with (see litforge/stages.py)."""
    from litforge.stages import SCHEDULES

    trainer, strategy = cfg.trainer, cfg.strategy
    pp, schedule = strategy.pipeline_parallel_size, strategy.schedule
    if problem := number_problem("strategy.pipeline_parallel_size", pp, integer=True, minimum=1):
        raise UserError(problem)
    if schedule not in SCHEDULES:
        raise UserError(f"strategy.schedule={schedule} is not one of {', '.join(SCHEDULES)}.")
    microbatches = strategy.get("microbatches") or 2 * pp
    if problem := number_problem("strategy.microbatches", microbatches, integer=True, minimum=1):
        raise UserError(problem)
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
            "strategy.pipeline_parallel_size>1: each stage saves its own shards (eval.py, "
            "predict.py and export.py read the folder on one device)."
        )


def check_pipeline_split(net, strategy) -> None:
    """More stages than the network has blocks: one line before the processes start."""
    pp = getattr(strategy, "pipeline_parallel_size", 1)
    if pp <= 1:
        return
    from litforge.parallelize import count_blocks
    from litforge.stages import num_stages

    stages, blocks = num_stages(pp, strategy.schedule), count_blocks(net)
    if stages > blocks:
        raise UserError(
            f"strategy.pipeline_parallel_size={pp} with strategy.schedule={strategy.schedule} "
            f"needs {stages} stages, but {type(net).__name__} has {blocks} blocks to split: use "
            f"fewer stages or a deeper network."
        )


def accelerator_is_cpu(accelerator: str) -> bool:
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def check_strategy(cfg: DictConfig) -> None:
    """Combinations of strategy, devices and precision that cannot run here, with the fix."""
    from litforge.strategies import mesh_sizes

    trainer, strategy = cfg.trainer, cfg.strategy
    target = str(strategy.get("_target_", strategy.get("name", "")))
    on_cpu = accelerator_is_cpu(str(trainer.accelerator))
    devices = trainer.devices
    if on_cpu and target.endswith("FSDPStrategy"):
        raise UserError(
            "strategy=fsdp needs GPUs (Lightning's FSDPStrategy refuses the CPU). On CPUs use "
            "strategy=model_parallel, which shards with FSDP2 on any device."
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
        pp = strategy.get("pipeline_parallel_size", 1)
        if pp != 1:
            check_pipeline(cfg)
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
    if target.endswith("ParameterServerStrategy"):
        check_parameter_server(cfg)
    if not on_cpu and isinstance(devices, int) and devices > torch.cuda.device_count():
        raise UserError(
            f"trainer.devices={devices}, but this machine has {torch.cuda.device_count()} GPU(s). "
            "Use fewer devices, or trainer.accelerator=cpu."
        )


def check_parameter_server(cfg: DictConfig) -> None:
    """What `strategy=parameter_server` needs (see litforge/parameter_server.py)."""
    from litforge.parameter_server import MODES

    trainer, strategy = cfg.trainer, cfg.strategy
    for key, minimum in (("num_servers", 1), ("max_staleness", 0), ("push_every", 1)):
        value = strategy.get(key)
        if problem := number_problem(f"strategy.{key}", value, integer=True, minimum=minimum):
            raise UserError(problem)
    if strategy.mode not in MODES:
        raise UserError(f"strategy.mode={strategy.mode} is not one of {', '.join(MODES)}.")
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


def check_restartable(strategy: Any) -> None:
    """Under torchrun with restarts, a strategy whose process group meets in a store that outlives
    the workers (`litforge.strategies.SurvivesRestarts` does not)."""
    from litforge import elastic
    from litforge.strategies import SurvivesRestarts

    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if (
        elastic.shared_agent_store()
        and several
        and elastic.restarting_launcher() == "torchrun"
        and not isinstance(strategy, SurvivesRestarts)
    ):
        raise UserError(
            f"torchrun --max-restarts with {type(strategy).__name__}: after a restart its workers "
            f"would look for the dead workers' addresses (pytorch #135712). Use strategy=ddp or "
            f"strategy=model_parallel, or start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1."
        )
