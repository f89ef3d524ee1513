"""The one pipeline behind `train.py` and `eval.py`; nothing here knows the task. A run: config
checks → datamodule → model (`model_arguments(datamodule)`) → Trainer (what the config lists) →
fit and test the best checkpoint, or test the module a checkpoint names → `metrics.json`."""

import copy
import inspect
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra.utils
import lightning as L
import torch
from hydra.errors import InstantiationException
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict

from litforge import checkpoints
from litforge.callbacks import LogRunConfig
from litforge.checks import (
    accelerator_is_cpu,
    check_config,
    check_data,
    check_network,
    check_shares,
)
from litforge.console import CONFIG_TREE, print_config, print_metrics, quiet_lightning
from litforge.data.base import model_arguments
from litforge.errors import UserError, user_error
from litforge.hooks import (
    ChecksFit,  # feature: model_parallel
    LogsRunFiles,  # feature: tracking
    PreparesRun,  # feature: backbones model_parallel parameter_server elastic tuning
)
from litforge.settings import check_targets
from litforge.strategies import lost_process_ends_the_job

log = logging.getLogger(__name__)
# On import too: for code that calls these functions without `start` (the benchmarks).
quiet_lightning()


def instantiate(config: Any, **kwargs: Any) -> Any:
    """Hydra's `instantiate`; a UserError of a constructor comes out as itself (Hydra wraps what
    a constructor raises in an InstantiationException, which Hydra's other errors pass as)."""
    try:
        return hydra.utils.instantiate(config, **kwargs)
    except InstantiationException as err:
        if (found := user_error(err)) is None:
            raise
        raise found from None


def start(cfg: DictConfig) -> None:
    check_config(cfg, needs_checkpoint=not cfg.get("train", False))  # before any output
    prepare_run(cfg)  # feature: backbones model_parallel parameter_server elastic tuning
    quiet_lightning()  # Hydra's logging is set up by now
    if cfg.extras.get("print_config"):
        print_config(cfg, save_to=Path(cfg.paths.output_dir) / CONFIG_TREE)
    if cfg.get("seed") is not None:  # `seed=0` is a seed too
        L.seed_everything(cfg.seed, workers=True)
    if rank_zero_only.rank == 0:  # not again in each process DDP starts
        describe_run(cfg)


def describe_run(cfg: DictConfig) -> None:
    """What the config leaves implicit: several processes on CPUs, no epoch limit."""
    trainer = cfg.trainer
    # The cores this process may use (a container's or job's share), where the system says.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    devices = trainer.get("devices")
    if accelerator_is_cpu(str(trainer.accelerator)) and isinstance(devices, int) and devices > 1:
        found = ", no GPU found" if trainer.accelerator == "auto" else ""
        log.info(
            f"trainer.devices={devices} on the CPU (trainer.accelerator={trainer.accelerator}"
            f"{found}): {devices} processes on this machine, gloo between them."
        )
        if devices > cores:
            log.warning(
                f"{devices} processes on {cores} CPU cores: they take turns, and train slower "
                f"than trainer.devices={cores} would."
            )
    if cfg.get("train") and trainer.get("max_epochs") == -1:
        log.info(
            "trainer.max_epochs=-1: no epoch limit. The run ends at trainer.max_steps or "
            "trainer.max_time when set, when early stopping stops it, or when you stop it: "
            "SIGTERM saves checkpoints/last.ckpt, and ckpt_path=last resumes."
        )


# feature: backbones model_parallel parameter_server elastic tuning
def prepare_run(cfg: DictConfig) -> None:
    """Call `prepare_run(cfg)` on each class the strategy and callbacks name that is a
    `hooks.PreparesRun`: a feature's own config checks and set-up, before anything is read or
    built. And the network's, when training: it may fill in data settings it needs (a pretrained
    network's image size)."""
    network = cfg.model.get("net") if cfg.get("train") and cfg.get("model") else None
    for entry in [cfg.get("strategy"), network, *(cfg.get("callbacks") or {}).values()]:
        cls = _target_class(entry)
        if isinstance(cls, type) and issubclass(cls, PreparesRun):
            cls.prepare_run(cfg)


def _target_class(entry: Any) -> Any:
    """What a config entry's `_target_` names; None when it names nothing importable (then
    instantiating it says so, by its key)."""
    target = entry.get("_target_") if OmegaConf.is_dict(entry) else None
    try:
        return hydra.utils.get_class(target) if target else None
    except Exception:
        return None


def build_datamodule(cfg: DictConfig) -> L.LightningDataModule:
    check_targets(cfg.data, "data")  # again: a checkpoint's settings or a feature's may be in
    check_data(cfg.data)
    # Plain lists and dicts: the settings go into checkpoints, read with weights_only=True.
    return instantiate(cfg.data, _convert_="all")


def build_model(cfg: DictConfig, datamodule: L.LightningDataModule) -> L.LightningModule:
    """The module of `model`, given what the data says (input shape, classes, normalization:
    `model_arguments`) where its constructor takes it and the config does not set it. Its
    configs (net, optimizer, scheduler) stay configs: the module builds them."""
    arguments = model_arguments(datamodule)
    check_network(cfg.model.get("net"), arguments["input_shape"])
    declared = parameters(hydra.utils.get_class(cfg.model._target_))
    given = {k: v for k, v in arguments.items() if k in declared and k not in cfg.model}
    model = instantiate(cfg.model, **given, _recursive_=False)
    if any(entry and entry.get("log_graph") for entry in (cfg.get("logger") or {}).values()):
        # Only then: the model summary would run it too, which a sharded model can't on one rank.
        model.example_input_array = torch.zeros(2, *arguments["input_shape"])
    return model


def parameters(cls: type) -> set[str]:
    """The names a class's constructor takes; through `**kwargs`, its parents' too (a subclass's
    `__init__(self, *args, **kwargs)` passes them on)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        signature = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in signature if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if all(p.kind != p.VAR_KEYWORD for p in signature):
            break
    return names


def _instantiate_entries(group: DictConfig | None) -> list[Any]:
    """The group's entries but null ones (off)."""
    return [instantiate(entry) for entry in _entries(group)]


def _entries(group: DictConfig | None) -> list[DictConfig]:
    return [entry for entry in (group or {}).values() if entry and "_target_" in entry]


def build_callbacks(cfg: DictConfig) -> list[L.Callback]:
    """The callbacks the config lists; `LogRunConfig` (and its subclasses) get the resolved run
    config as `run_config` (a config cannot hold itself: its yaml says `run_config: ???`)."""
    resolved = None
    callbacks = []
    for entry in _entries(cfg.get("callbacks")):
        cls = _target_class(entry)
        if isinstance(cls, type) and issubclass(cls, LogRunConfig):
            resolved = resolved or OmegaConf.to_container(cfg, resolve=True)
            callbacks.append(instantiate(entry, run_config=resolved))
        else:
            callbacks.append(instantiate(entry))
    return callbacks


def build_trainer(cfg: DictConfig) -> L.Trainer:
    callbacks = build_callbacks(cfg)
    loggers = _instantiate_entries(cfg.get("logger"))
    if not loggers and any(isinstance(cb, LearningRateMonitor) for cb in callbacks):
        # Lightning refuses a LearningRateMonitor without a logger (Lightning #17159, open).
        log.info("logger=none: the learning-rate monitor has nowhere to log, leaving it out.")
        callbacks = [cb for cb in callbacks if not isinstance(cb, LearningRateMonitor)]
    strategy = instantiate(cfg.strategy) if "_target_" in cfg.strategy else cfg.strategy.name
    settings = copy.copy(cfg.trainer)  # the Trainer's arguments: all but the matmul precision
    with open_dict(settings):
        matmul_precision = settings.pop("float32_matmul_precision", None)
    if matmul_precision is not None:  # before Lightning checks it (its "Tensor Cores" advice)
        torch.set_float32_matmul_precision(matmul_precision)
    return instantiate(
        settings,
        strategy=strategy,
        callbacks=callbacks,
        logger=loggers or False,
    )


def _float_metrics(trainer: L.Trainer) -> dict[str, float]:
    return {
        name: float(value)
        for name, value in trainer.callback_metrics.items()
        if isinstance(value, torch.Tensor)
        and value.numel() == 1
        and not name.endswith(("_step", "_epoch"))  # `train/loss` holds the epoch value
    }


def fit(trainer: L.Trainer, model: L.LightningModule, datamodule, ckpt_path=None) -> None:
    """`trainer.fit`; a lost process ends the job in one line."""
    with (
        checkpoints.stopped_by_sigterm(trainer, "training"),
        lost_process_ends_the_job(trainer.strategy),
    ):
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)


def test(trainer: L.Trainer, model: L.LightningModule, datamodule, ckpt_path=None) -> None:
    with checkpoints.stopped_by_sigterm(trainer, "testing"):
        trainer.test(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit, then test the best checkpoint; with `train=false`, test `ckpt_path`."""
    start(cfg)
    fitting = cfg.get("train")
    datamodule = build_datamodule(cfg)
    model = build_model(cfg, datamodule)
    trainer = build_trainer(cfg)
    evaluated = ["val"] if fitting and trainer.limit_val_batches else []
    check_shares(datamodule, trainer, evaluated + (["test"] if cfg.get("test") else []))
    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path:
        folders = {
            d: 1 for cb in trainer.checkpoint_callbacks if (d := getattr(cb, "dirpath", None))
        }
        ckpt_path = checkpoints.checkpoint_file(ckpt_path, list(folders) or [_checkpoints(cfg)])
    if ckpt_path and not Path(ckpt_path).is_dir():  # (a folder of shards: its strategy's)
        checkpoint = checkpoints.read(ckpt_path)
        check_fits(checkpoint, ckpt_path, model, datamodule, fitting)
        at = f"epoch {checkpoint.get('epoch')}, step {checkpoint.get('global_step')}"
        checkpoints.info_on_rank_zero(
            f"{'Resuming from' if fitting else 'Testing'} {ckpt_path} ({at})"
        )
    if isinstance(trainer.strategy, ChecksFit):  # before processes start  # feature: model_parallel
        trainer.strategy.check_fit(model, ckpt_path if fitting else None)
    metrics: dict[str, float] = {}
    if fitting:
        fit(trainer, model, datamodule, ckpt_path=ckpt_path)
        if ckpt_path and not any(k.startswith("val/") for k in trainer.callback_metrics):
            log.warning(
                f"{ckpt_path} already reached trainer.max_epochs={trainer.max_epochs}: nothing "
                f"left to train, validating it instead. (More epochs: trainer.max_epochs=<more>; "
                f"the learning-rate schedule then follows the new settings.)"
            )
            trainer.validate(model, datamodule=datamodule)
        metrics.update(_float_metrics(trainer))
        monitors = [cb for cb in trainer.checkpoint_callbacks if getattr(cb, "monitor", None)]
        ckpt_path = monitors[0].best_model_path if monitors else None
        if not ckpt_path and cfg.get("test") and monitors:
            log.warning(
                f"Testing the final weights: the checkpoint of the best {monitors[0].monitor} "
                f"saved none (no validation, or fast_dev_run)."
            )
        elif not ckpt_path and cfg.get("test"):  # (chosen: callbacks.model_checkpoint.monitor=null)
            log.info("Testing the final weights: no checkpoint callback monitors a metric.")
    elif not ckpt_path:
        raise UserError(f"ckpt_path={cfg.ckpt_path}: no checkpoint in this run's folder to test.")
    if cfg.get("test"):
        test(trainer, model, datamodule, ckpt_path=ckpt_path or None)
        metrics.update(_float_metrics(trainer))
    return finish(cfg, trainer, metrics)


def _checkpoints(cfg: DictConfig) -> Path:  # a run's checkpoint folder, with callbacks=none
    return Path(cfg.paths.output_dir) / "checkpoints"


def check_fits(
    checkpoint: dict[str, Any], ckpt_path: str, model: L.LightningModule, datamodule, fitting: bool
) -> None:
    """The checkpoint to resume or test fits the module the config built: its data, its
    tensors' shapes, and (resuming restores their states) its optimizer and scheduler classes."""
    name, classes = datamodule.hparams.get("name"), model_arguments(datamodule)["class_names"]
    checkpoints.check_same_dataset(checkpoint, name, ckpt_path, classes)
    checkpoints.check_same_shapes(checkpoint["state_dict"], model.state_dict(), ckpt_path)
    saved = checkpoint.get("hyper_parameters") or {} if fitting else {}
    for key in ("optimizer", "scheduler"):
        old, new = saved.get(key), model.hparams.get(key)
        plain = isinstance(old, Mapping) and isinstance(new, Mapping)
        if plain and old.get("_target_") != new.get("_target_"):
            raise UserError(
                f"model.{key}._target_={new.get('_target_')}, but {ckpt_path} was trained "
                f"with {old.get('_target_')}: a resumed run goes on from the saved {key} "
                f"state, which fits only that. Resume with the {key} it was trained with, "
                f"or start a new run."
            )


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Test a checkpoint with the module and settings it stores (`model=` may name the class)."""
    start(cfg)
    checkpoint = checkpoints.read(cfg.ckpt_path)
    data_from_checkpoint(cfg, checkpoint)
    datamodule = build_datamodule(cfg)
    classes = model_arguments(datamodule)["class_names"]
    where = f"ckpt_path={cfg.ckpt_path}"
    checkpoints.check_same_dataset(checkpoint, datamodule.hparams.get("name"), where, classes)
    target = cfg.model._target_ if cfg.get("model") else None
    model_class = checkpoints.module_class(checkpoint, where, target)
    model = checkpoints.build_module(checkpoint, model_class, where)
    trainer = build_trainer(cfg)
    check_shares(datamodule, trainer, ["test"])
    test(trainer, model, datamodule, ckpt_path=cfg.ckpt_path)  # (read once: `checkpoints.read`)
    return finish(cfg, trainer, _float_metrics(trainer))


def data_from_checkpoint(cfg: DictConfig, checkpoint: dict[str, Any]) -> None:
    """Fill in unset data settings the checkpoint knows; one set to another value: UserError."""
    hp = checkpoints.data_settings(checkpoint)
    if not hp.get("input_shape"):
        return
    channels, height, width = hp["input_shape"]
    known = {
        "image_size": height if height == width else None,
        "channels": channels,
        "mean": hp.get("mean"),
        "std": hp.get("std"),
        "interpolation": (checkpoint.get("datamodule_hyper_parameters") or {}).get("interpolation"),
    }
    for key, trained in known.items():
        if trained is None or key not in cfg.data:
            continue
        given = cfg.data[key]
        if given is None:
            cfg.data[key] = trained
        elif not _same(given, trained):
            raise UserError(
                f"data.{key}={given}, but {cfg.ckpt_path} was trained with {trained}: leave "
                f"data.{key} out (it comes from the checkpoint), or evaluate another checkpoint."
            )


def _same(given: Any, trained: Any) -> bool:
    given = OmegaConf.to_object(given) if OmegaConf.is_config(given) else given
    if not isinstance(trained, list) or not isinstance(given, list) or len(given) != len(trained):
        return given == trained
    return all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(given, trained, strict=True))


def finish(cfg: DictConfig, trainer: L.Trainer, metrics: dict[str, float]) -> dict[str, float]:
    if trainer.is_global_zero:
        output_dir = Path(cfg.paths.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        metrics_json = json.dumps(metrics, indent=2, sort_keys=True)
        (output_dir / "metrics.json").write_text(metrics_json + "\n")
        for logger in trainer.loggers:  # feature: tracking
            if isinstance(logger, LogsRunFiles):
                callback = trainer.checkpoint_callback
                logger.log_run_files(output_dir, callback.best_model_path if callback else None)
        print_metrics(metrics, output_dir)
    # A job's processes close their process group here, not at the interpreter's exit: gloo's
    # threads still holding tensors then can abort the process ("terminate called without an
    # active exception", exit -6; pytorch/pytorch#179291). (A one-process group stays: the next
    # run in this process reuses it.)
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.destroy_process_group()
    return metrics


def optimized_metric(cfg: DictConfig, metrics: dict[str, float]) -> float | None:
    """The value a sweeper optimizes (`optimized_metric`); None for a run that did not train."""
    name = cfg.get("optimized_metric")
    if not name or (name not in metrics and not cfg.get("train")):
        return None
    if name not in metrics:
        logged = ", ".join(sorted(metrics))
        raise UserError(f"optimized_metric={name} was not logged. Logged: {logged}.")
    return metrics[name] if math.isfinite(metrics[name]) else float("nan")
