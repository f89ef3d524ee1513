"""The one pipeline behind `train.py` and `eval.py`; nothing here knows the task. A run: config
checks → datamodule → model (`model_arguments(datamodule)`) → Trainer (what the config lists) →
fit and test the best checkpoint, or test the module a checkpoint names → `metrics.json`."""

import copy
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import hydra.utils
import lightning as L
import torch
from hydra.errors import InstantiationException
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict

from litforge import checkpoints, resume
from litforge.callbacks import LogRunConfig
from litforge.checks import accelerator_is_cpu, check_config
from litforge.console import CONFIG_TREE, print_config, print_metrics, quiet_lightning
from litforge.data.base import DataModule, model_arguments
from litforge.errors import UserError, user_error
from litforge.hooks import ChecksFit, LogsRunFiles, PreparesRun
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
    prepare_run(cfg)
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
    # Plain lists and dicts: the settings go into checkpoints, read with weights_only=True.
    return instantiate(cfg.data, _convert_="all")


def build_model(cfg: DictConfig, datamodule: L.LightningDataModule) -> L.LightningModule:
    # net, optimizer and scheduler stay configs: the module builds them.
    arguments = model_arguments(datamodule)
    model = instantiate(cfg.model, **arguments, _recursive_=False)
    if any(entry and entry.get("log_graph") for entry in (cfg.get("logger") or {}).values()):
        # Only then: the model summary would run it too, which a sharded model can't on one rank.
        model.example_input_array = torch.zeros(2, *arguments["input_shape"])
    return model


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
        resume.stopped_by_sigterm(trainer, "training"),
        lost_process_ends_the_job(trainer.strategy),
    ):
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)


def test(trainer: L.Trainer, model: L.LightningModule, datamodule, ckpt_path=None) -> None:
    with resume.stopped_by_sigterm(trainer, "testing"):
        trainer.test(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit, then test the best checkpoint; with `train=false`, test `ckpt_path`."""
    start(cfg)
    fitting = cfg.get("train")
    ckpt_path, checkpoint = cfg.get("ckpt_path"), None
    if ckpt_path == "auto":  # before the loggers, which append to a resumed run's logs
        found = resume.auto_checkpoint(cfg.paths.output_dir, fitting=fitting)
        ckpt_path = str(found) if found else None
    cfg.ckpt_path = ckpt_path  # train.yaml has the key: the run's logged config gets the path
    datamodule = build_datamodule(cfg)
    model = build_model(cfg, datamodule)
    if fitting and rank_zero_only.rank == 0:
        warn_unless_loadable(model, datamodule)
    trainer = build_trainer(cfg)
    evaluated = ["val"] if fitting and trainer.limit_val_batches else []
    check_shares(datamodule, trainer, evaluated + (["test"] if cfg.get("test") else []))
    if ckpt_path:
        ckpt_path, checkpoint = resume.checked_checkpoint(
            ckpt_path, cfg.paths.output_dir, model, datamodule.hparams.get("name"), fitting
        )
    if isinstance(trainer.strategy, ChecksFit):  # before processes start
        trainer.strategy.check_fit(model, ckpt_path if fitting else None)
    metrics: dict[str, float] = {}
    if fitting:
        fit(trainer, model, datamodule, ckpt_path=ckpt_path)
        if ckpt_path and not any(k.startswith("val/") for k in trainer.callback_metrics):
            log.warning(
                f"{ckpt_path} already reached trainer.max_epochs={trainer.max_epochs}: nothing "
                f"left to train, validating it instead. (More epochs: trainer.max_epochs=<more> "
                f"{checkpoints.override('ckpt_path', ckpt_path)}; the saved learning-rate "
                f"schedule goes on, which a longer cosine would not be.)"
            )
            trainer.validate(model, datamodule=datamodule)
        metrics.update(_float_metrics(trainer))
        monitors = [cb for cb in trainer.checkpoint_callbacks if getattr(cb, "monitor", None)]
        ckpt_path = monitors[0].best_model_path if monitors else None
        if not ckpt_path and cfg.get("test"):
            why = (
                f"the checkpoint of the best {monitors[0].monitor} saved none (no validation, "
                f"or fast_dev_run)"
                if monitors
                else "no checkpoint callback monitors a metric"
            )
            log.warning(f"Testing the final weights: {why}.")
    elif checkpoint is not None:
        # Loaded here rather than by Lightning: a folder of shards then tests on any strategy.
        model.load_state_dict(checkpoint["state_dict"])
        ckpt_path = None

    if cfg.get("test"):
        test(trainer, model, datamodule, ckpt_path=ckpt_path or None)
        metrics.update(_float_metrics(trainer))
    return finish(cfg, trainer, metrics)


def check_shares(datamodule: L.LightningDataModule, trainer: L.Trainer, splits: list[str]) -> None:
    """Each process evaluates its own share of a split: fewer images than processes would leave
    one with none (Lightning's sampler asserts in it). Refused before the processes start."""
    processes = trainer.world_size
    sizes = datamodule.split_sizes() if isinstance(datamodule, DataModule) else {}
    for split in splits:
        count, settings = sizes.get(split, (0, ""))
        if 0 < count < processes:
            name = {"val": "validation"}.get(split, split)
            raise UserError(
                f"{count} {name} images for {processes} processes (trainer.devices × "
                f"trainer.num_nodes): each process needs one or more. Add {name} images "
                f"({settings}), or use fewer processes."
            )


def warn_unless_loadable(model: L.LightningModule, datamodule: L.LightningDataModule) -> None:
    """Your config builds anything; a checkpoint only what `litforge.models` registers: said at
    the start of a run whose checkpoints would not load."""
    from litforge.models import MODULES

    settings, built = dict(model.hparams), ("net", "optimizer", "scheduler")
    # Each built setting on its own: all that need registering are said at once.
    parts = [{k: v for k, v in settings.items() if k not in built}]
    parts += [{k: settings[k]} for k in built if k in settings]
    problems = []
    for part in parts:
        saved = {"hyper_parameters": part, "datamodule_hyper_parameters": dict(datamodule.hparams)}
        try:
            checkpoints.check_registered(saved, "This run")
        except UserError as err:
            problems.append(str(err))
    if problems:
        problems.append("Until then its checkpoints load neither in eval.py nor to resume.")
        log.warning("\n".join(dict.fromkeys(problems)))
    if type(model) not in MODULES:
        log.warning(
            f"This run's module, {checkpoints.class_path(type(model))}, is not in "
            f"litforge.models.MODULES: eval.py builds its checkpoints as that class only when "
            f"given model=<its config>. Add it to MODULES to load them without."
        )


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Test a checkpoint (a file or a folder of shards) with the module and settings it stores."""
    start(cfg)
    checkpoint = checkpoints.read_checkpoint(cfg.ckpt_path)
    data_from_checkpoint(cfg, checkpoint)
    datamodule = build_datamodule(cfg)
    name, classes = datamodule.hparams.get("name"), model_arguments(datamodule)["class_names"]
    checkpoints.check_same_dataset(checkpoint, name, cfg.ckpt_path, classes)
    # The settings come from the checkpoint; `model=` may name the module class.
    target = cfg.model._target_ if cfg.get("model") else None
    model = checkpoints.load_module(checkpoint, cfg.ckpt_path, target)
    trainer = build_trainer(cfg)
    check_shares(datamodule, trainer, ["test"])
    test(trainer, model, datamodule)
    return finish(cfg, trainer, _float_metrics(trainer))


def data_from_checkpoint(cfg: DictConfig, checkpoint: dict[str, Any]) -> None:
    """Fill in unset data settings the checkpoint knows; one set to another value: UserError."""
    hp = checkpoint.get("hyper_parameters") or {}
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
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else None
        for logger in trainer.loggers:
            if isinstance(logger, LogsRunFiles):
                logger.log_run_files(output_dir, best)
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
