"""Config checks, named by their config keys, before any data is read or process launched: each
value of `data` and `model` against the annotation of the constructor that takes it
(`settings.check_targets`), the settings no constructor of ours takes (`OTHERS`), and the
settings that cannot work together (`check_data`, `check_strategy`, ...)."""

from typing import Annotated, Any, Literal

import torch
from annotated_types import Ge
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from litforge.errors import UserError
from litforge.settings import (
    NonNegative,
    NonNegativeInt,
    Positive,
    PositiveInt,
    check_targets,
    check_values,
)

# Settings no constructor of ours takes (the run's own, torch's optimizers', Lightning's Trainer's):
# their types and bounds, as ours are in our constructors' annotations (settings.py).
OTHERS = {
    "seed": NonNegativeInt | None,
    "train": bool,
    "test": bool,
    "optimized_metric_mode": Literal["max", "min"],
    "model.optimizer.lr": Positive,
    "model.optimizer.weight_decay": NonNegative,
    # Lightning's scheduler settings, which the module takes from model.scheduler:
    "model.scheduler.interval": Literal["epoch", "step"],
    "model.scheduler.frequency": PositiveInt,
    "model.scheduler.monitor": str,
    "model.scheduler.strict": bool,
    "model.scheduler.name": str | None,
    "trainer.max_epochs": Annotated[int, Ge(-1)] | None,
    "trainer.accumulate_grad_batches": PositiveInt,
    "trainer.gradient_clip_val": NonNegative | None,
    "trainer.float32_matmul_precision": Literal["highest", "high", "medium"] | None,
}
# The config groups whose classes `settings.check_targets` checks the values of.
GROUPS = ("data", "model", "trainer", "callbacks", "logger", "strategy")
# What `trainer.accelerator` may be: Lightning's names (`gpu`: CUDA or Apple's MPS).
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")


def check_config(cfg: DictConfig, needs_checkpoint: bool = False) -> None:
    """Raise a UserError naming the first config value that cannot work."""
    check_values(cfg, OTHERS)
    for group in GROUPS:
        if group in cfg:  # each value against its constructor's annotation
            check_targets(cfg[group], group, OTHERS)
    if cfg.get("train") and OmegaConf.select(cfg, "trainer.max_epochs") == 0:
        raise UserError(
            "trainer.max_epochs=0 trains nothing: set 1 or more (-1: no limit). To test a "
            "checkpoint without training: train=false ckpt_path=<checkpoint>, or eval.py."
        )
    if needs_checkpoint and not cfg.get("ckpt_path"):
        raise UserError(
            "no checkpoint given: add ckpt_path=<file or folder>, e.g. "
            "logs/train/runs/<run>/checkpoints/last.ckpt"
        )
    if "model" in cfg:
        check_model(cfg.model)
    check_accelerator(cfg)
    check_strategy(cfg)
    check_precision(cfg)
    if "data" in cfg:
        check_data(cfg.data)


def check_data(data: DictConfig) -> None:
    """Data settings that cannot work together (each one alone: `check_targets`)."""
    folds, fold = data.get("num_folds"), data.get("fold") or 0
    if folds is not None and fold >= folds:
        raise UserError(
            f"data.fold={fold} is not a fold of data.num_folds={folds}: give 0 to {folds - 1} "
            f"(all of them: -m data.fold={','.join(map(str, range(folds)))})."
        )
    val, test = data.get("val_fraction") or 0, data.get("test_fraction") or 0
    if val + test >= 1:
        raise UserError(
            f"data.val_fraction={val} and data.test_fraction={test} leave no training images: "
            f"their sum must be below 1."
        )
    if ("mean" in data or "std" in data) and (data.get("mean") is None) != (
        data.get("std") is None
    ):
        raise UserError("data.mean and data.std go together: give both or neither.")
    mean, std, channels = data.get("mean"), data.get("std"), data.get("channels")
    given = mean is not None and std is not None
    counts = {len(mean), len(std), *([channels] if channels else [])} if given else {1}
    if len(counts) > 1 or not counts <= {1, 3}:
        which = f" for data.channels={channels}" if channels else ""
        raise UserError(
            f"data.mean and data.std hold {len(mean)} and {len(std)} values{which}: give one "
            f"per channel (1 or 3), or null for ImageNet's."
        )
    crop = data.get("crop_scale")
    if crop is not None and crop[0] > crop[1]:
        raise UserError(
            f"data.crop_scale=[{crop[0]},{crop[1]}]: the first (smallest share of the image) "
            f"must not be above the second, e.g. data.crop_scale=[0.35,1]."
        )
    try:
        dataset = get_object(data._target_)
    except Exception:  # a `_target_` that does not import: Hydra's instantiate says so
        return
    images = getattr(dataset, "num_train_images", None)
    if images is not None and (data.get("val_size") or 0) >= images:
        raise UserError(
            f"data.val_size={data.val_size} must be below the {images} training images of "
            f"{dataset.name}."
        )


def check_model(model: DictConfig) -> None:
    """Module settings that need another."""
    scheduler, optimizer = model.get("scheduler"), model.get("optimizer")
    scheduler = scheduler if isinstance(scheduler, DictConfig) else {}  # (a class of yours may
    optimizer = optimizer if isinstance(optimizer, DictConfig) else {}  # take other kinds)
    if str(scheduler.get("_target_")).endswith("ReduceLROnPlateau") and "monitor" not in scheduler:
        raise UserError(
            "model.scheduler: ReduceLROnPlateau steps on a logged metric, and "
            "model.scheduler.monitor is not set. Add +model.scheduler.monitor=val/loss "
            "(or another metric the run logs)."
        )
    if model.get("backbone_lr_scale", 1) != 1 and optimizer and "lr" not in optimizer:
        raise UserError("model.backbone_lr_scale needs model.optimizer.lr to scale.")


def check_network(net: DictConfig | None, input_shape: list[int]) -> None:
    """A network's settings that do not fit the data's images (known once the data is)."""
    target = str((net or {}).get("_target_", ""))
    blocks = len(net.get("channels") or ()) if target.endswith(".CNN") else 0
    height, width = input_shape[1:]
    if height >> blocks == 0 or width >> blocks == 0:  # each CNN block halves them
        raise UserError(
            f"model.net.channels: {blocks} pooling blocks shrink {height}×{width} images to "
            f"nothing: use fewer entries, or a larger data.image_size."
        )


def check_shares(datamodule: Any, trainer: Any, splits: list[str]) -> None:
    """Each process evaluates its own share of a split: fewer images than processes would leave
    one with none (Lightning's sampler asserts in it). Refused before the processes start."""
    processes = trainer.world_size
    sizes = datamodule.split_sizes() if hasattr(datamodule, "split_sizes") else {}
    for split in splits:
        count, settings = sizes.get(split, (0, ""))
        if 0 < count < processes:
            name = {"val": "validation"}.get(split, split)
            raise UserError(
                f"{count} {name} images for {processes} processes (trainer.devices × "
                f"trainer.num_nodes): each process needs one or more. Add {name} images "
                f"({settings}), or use fewer processes."
            )


def accelerator_is_cpu(accelerator: str) -> bool:
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def check_accelerator(cfg: DictConfig) -> None:
    """An accelerator Lightning does not know, or one this machine lacks (but GPUs: counted in
    `check_strategy`)."""
    accelerator = cfg.trainer.get("accelerator")
    if not isinstance(accelerator, str):  # (an Accelerator's config: Lightning checks it)
        return
    if accelerator not in ACCELERATORS:
        raise UserError(
            f"trainer.accelerator={accelerator} is not one of: {', '.join(ACCELERATORS)}."
        )
    if accelerator in ("mps", "tpu"):
        from lightning.pytorch.accelerators import AcceleratorRegistry

        if not AcceleratorRegistry[accelerator]["accelerator"].is_available():
            raise UserError(
                f"trainer.accelerator={accelerator}, but this machine has no {accelerator} "
                f"(or its library is missing): use trainer.accelerator=auto (a GPU if there is "
                f"one, else the CPU) or trainer.accelerator=cpu."
            )


def check_strategy(cfg: DictConfig) -> None:
    """Combinations of strategy, devices and precision that cannot run here."""
    trainer, strategy = cfg.trainer, cfg.strategy
    target = str(strategy.get("_target_", strategy.get("name", "")))
    on_cpu = accelerator_is_cpu(str(trainer.accelerator))
    devices = trainer.devices
    if on_cpu and target.endswith("FSDPStrategy"):
        fix = " On CPUs: strategy=ddp (no sharding)."
        fix = " On CPUs: strategy=model_parallel (FSDP2, any device)."  # feature: model_parallel
        raise UserError(
            f"strategy=fsdp needs GPUs (Lightning's FSDPStrategy refuses the CPU).{fix}"
        )
    if on_cpu and trainer.get("sync_batchnorm"):
        raise UserError(
            "trainer.sync_batchnorm=true works on GPUs only (torch's SyncBatchNorm). "
            "Remove it for CPU runs."
        )
    on_cuda = trainer.accelerator in ("cuda", "auto") or (
        trainer.accelerator == "gpu" and not torch.backends.mps.is_available()
    )
    if not on_cpu and on_cuda and isinstance(devices, int) and devices > torch.cuda.device_count():
        raise UserError(
            f"trainer.accelerator={trainer.accelerator} with trainer.devices={devices}, but this "
            f"machine has {torch.cuda.device_count()} GPU(s). Use fewer devices, or "
            f"trainer.accelerator=cpu."
        )


def check_precision(cfg: DictConfig) -> None:
    """A matmul precision torch does not know; bfloat16 on a GPU without bfloat16 units."""
    trainer = cfg.trainer
    bf16 = str(trainer.get("precision")).startswith("bf16")
    on_gpu = not accelerator_is_cpu(str(trainer.accelerator)) and torch.cuda.is_available()
    # (Without `including_emulation=False`, torch says yes to any GPU: it would emulate, slowly.)
    if bf16 and on_gpu and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise UserError(
            f"trainer.precision={trainer.precision}, but this GPU "
            f"({torch.cuda.get_device_name()}) has no bfloat16 units (GPUs before Ampere): set "
            f"trainer.precision=16-mixed, or 32-true."
        )
