"""The one pipeline behind `train.py` and `eval.py`: build data, model, loggers, callbacks and
trainer from a Hydra config, run, and write the final metrics.

Both entry points call these functions; nothing here depends on which one is running.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hydra.utils
import lightning as L
import torch
from hydra.errors import InstantiationException
from lightning.pytorch.callbacks import Callback, LearningRateMonitor
from lightning.pytorch.loggers import Logger, TensorBoardLogger, WandbLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from litforge import plots
from litforge.callbacks import (
    OPTUNA_TRIAL_ENV,
    EpochHistory,
    LastCheckpoint,
    OptunaPruning,
    ResumeState,
)
from litforge.checkpointing import AtomicCheckpointIO, read_checkpoint, resume_path
from litforge.data.base import InMemoryImageDataModule
from litforge.errors import UserError, check_number, user_error_in
from litforge.models.classifier import ClassificationModule
from litforge.strategies import check_strategy
from litforge.utils import print_config, print_metrics

log = logging.getLogger(__name__)


def instantiate(config: Any, **kwargs: Any) -> Any:
    """Hydra's `instantiate`, letting our `UserError`s through unwrapped (Hydra wraps whatever a
    constructor raises in its own exception)."""
    try:
        return hydra.utils.instantiate(config, **kwargs)
    except InstantiationException as err:
        if (user_error := user_error_in(err)) is not None:
            raise user_error from err
        raise


def seed(cfg: DictConfig) -> None:
    if cfg.get("seed") is not None:  # `seed=0` is a seed too
        L.seed_everything(cfg.seed, workers=True)


def build_datamodule(cfg: DictConfig) -> InMemoryImageDataModule:
    return instantiate(cfg.data)


def build_model(cfg: DictConfig, datamodule: InMemoryImageDataModule) -> ClassificationModule:
    # The datamodule knows the input shape and classes; the model config need not repeat them.
    model = instantiate(
        cfg.model,
        input_shape=datamodule.input_shape,
        num_classes=datamodule.num_classes,
        class_names=datamodule.class_names,
        _recursive_=False,  # net/optimizer/scheduler stay configs; the module builds them
    )
    if any(entry and entry.get("log_graph") for entry in (cfg.get("logger") or {}).values()):
        # What TensorBoard traces the graph with. Only then: Lightning's model summary would
        # also run it through the model, which sharded models cannot do on one rank.
        model.example_input_array = torch.zeros(2, *datamodule.input_shape)
    return model


def _instantiate_all(group: DictConfig | None) -> list[Any]:
    """Instantiate each entry of a `{name: {_target_: ...}}` group; null entries are off."""
    if not group:
        return []
    return [instantiate(entry) for entry in group.values() if entry and "_target_" in entry]


def build_trainer(cfg: DictConfig) -> L.Trainer:
    check_strategy(cfg)  # before any process is launched
    check_number("trainer.max_epochs", cfg.trainer.max_epochs, integer=True, minimum=-1)
    check_number(
        "trainer.accumulate_grad_batches",
        cfg.trainer.accumulate_grad_batches,
        integer=True,
        minimum=1,
    )
    callbacks: list[Callback] = _instantiate_all(cfg.get("callbacks"))
    loggers: list[Logger] = _instantiate_all(cfg.get("logger"))
    if not loggers and any(isinstance(cb, LearningRateMonitor) for cb in callbacks):
        log.info("logger=none: the learning-rate monitor has nowhere to log, leaving it out.")
        callbacks = [cb for cb in callbacks if not isinstance(cb, LearningRateMonitor)]
    strategy = instantiate(cfg.strategy) if "_target_" in cfg.strategy else cfg.strategy.name
    callbacks.append(EpochHistory())  # for plots/curves.png
    if loggers:
        callbacks.append(LogRunConfig(OmegaConf.to_container(cfg, resolve=True)))
    if os.environ.get(OPTUNA_TRIAL_ENV) and cfg.get("optimized_metric"):
        callbacks.append(OptunaPruning(os.environ[OPTUNA_TRIAL_ENV], cfg.optimized_metric))
    callbacks.append(ResumeState())  # RNG states in checkpoints
    trainer = instantiate(
        cfg.trainer, strategy=strategy, callbacks=callbacks, logger=loggers or False
    )
    try:
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
    except NotImplementedError:  # sharded strategies write with torch.distributed.checkpoint
        pass
    return trainer


class LogRunConfig(Callback):
    """Log the whole resolved run config to every logger (rather than the model's arguments),
    with the batch size per process and in total (`batch_size.per_device`, `batch_size.global`).

    In `setup`, which Lightning calls after `prepare_data`: a run whose data is missing leaves
    no logger files behind.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        per_device = self.config["data"]["batch_size"]
        # Data-parallel replicas: processes that see different data (tensor parallel ranks
        # share theirs), times gradient accumulation.
        replicas = (trainer.distributed_sampler_kwargs or {}).get("num_replicas", 1)
        total = per_device * replicas * trainer.accumulate_grad_batches
        if trainer.is_global_zero and stage == "fit":
            log.info(
                "Batch size: %d per process x %d data-parallel process(es) x %d accumulated = %d",
                per_device,
                replicas,
                trainer.accumulate_grad_batches,
                total,
            )
        config = {**self.config, "batch_size": {"per_device": per_device, "global": total}}
        for logger in trainer.loggers:
            logger.log_hyperparams(config)


def _float_metrics(trainer: L.Trainer) -> dict[str, float]:
    """Epoch-level scalars as logged (`train/loss`, `val/acc_best`, `test/acc`, ...)."""
    return {
        name: float(value)
        for name, value in trainer.callback_metrics.items()
        if isinstance(value, torch.Tensor)
        and value.numel() == 1
        and not name.endswith(("_step", "_epoch"))  # `train/loss` holds the epoch value
    }


def fit(trainer: L.Trainer, model: L.LightningModule, datamodule, ckpt_path=None) -> None:
    """`trainer.fit`, after moving the ~400k long-lived objects that imports, configs and data
    leave behind out of the garbage collector's sight: each full collection during training would
    scan them all (~0.1 s here) and find nothing to free.

    A SIGTERM (preemption, `scancel`, a time limit) stops training after the current batch;
    `callbacks.LastCheckpoint` saves it, and the process exits with status 143 (128 + SIGTERM).
    """
    gc.collect()
    gc.freeze()
    with stopped_by_sigterm(trainer, "training"):
        try:
            trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        except Exception as err:
            lost = getattr(trainer.strategy, "lost_process", None)  # ReportsLostProcesses
            if lost:
                raise UserError(lost) from err
            raise


@contextmanager
def stopped_by_sigterm(trainer: L.Trainer, what: str) -> Iterator[None]:
    """Lightning stops on SIGTERM by raising SIGTERMException, a SystemExit with status 0; exit
    with 143 instead (128 + SIGTERM, what schedulers expect of a stopped job), saying so."""
    try:
        yield
    except SIGTERMException:
        if trainer.is_global_zero:
            saved = [cb for cb in trainer.callbacks if isinstance(cb, LastCheckpoint)]
            where = f"saved to {saved[0].path}" if saved else "not saved"
            log.warning(
                f"Stopped by SIGTERM while {what} at epoch {trainer.current_epoch}, step "
                f"{trainer.global_step}; checkpoint {where}. To resume, run the same command "
                f"with ckpt_path=last."
            )
        sys.exit(143)


def resume_checkpoint(
    cfg: DictConfig, model: ClassificationModule, datamodule: InMemoryImageDataModule
) -> str | None:
    """The checkpoint `ckpt_path` names (`last`: the newest of this run that loads), checked to
    fit this model and dataset before anything starts."""
    ckpt_path = cfg.get("ckpt_path")
    if not ckpt_path:
        return None
    if ckpt_path == "last":
        checkpoints = Path(cfg.paths.output_dir) / "checkpoints"
        if not checkpoints.is_dir():  # ${run_dir:} found no earlier run of this command
            raise UserError(
                f"ckpt_path=last: no earlier run of this command (the same overrides, ckpt_path "
                f"aside) has a checkpoint in {Path(cfg.paths.output_dir).parent}. Resume a given "
                f"run with hydra.run.dir=<its folder> ckpt_path=last, or ckpt_path=<file>."
            )
        ckpt_path = str(resume_path(checkpoints))
    if Path(ckpt_path).is_dir():  # shards (model_parallel): the strategy reads and checks them
        return ckpt_path
    checkpoint = read_checkpoint(ckpt_path)
    check_same_dataset(checkpoint, datamodule, ckpt_path)
    check_same_shapes(checkpoint["state_dict"], model.state_dict(), ckpt_path)
    return ckpt_path


def check_same_dataset(
    checkpoint: dict[str, Any], datamodule: InMemoryImageDataModule, ckpt_path: str
) -> None:
    trained_on = checkpoint.get("datamodule_hyper_parameters", {}).get("name")
    if trained_on and trained_on != datamodule.source.name:
        raise UserError(
            f"{ckpt_path} was trained on '{trained_on}', the config selects "
            f"'{datamodule.source.name}'. Add data={trained_on}."
        )


def check_same_shapes(saved: dict[str, Any], current: dict[str, Any], ckpt_path: str) -> None:
    """One line naming the weights that differ between a checkpoint and the configured model."""
    differences = [
        f"{k}: checkpoint {list(saved[k].shape)}, model {list(v.shape)}"
        for k, v in current.items()
        if k in saved and hasattr(v, "shape") and tuple(saved[k].shape) != tuple(v.shape)
    ]
    differences += [f"missing {k}" for k in current if k not in saved]
    differences += [f"unexpected {k}" for k in saved if k not in current]
    if differences:
        shown = "; ".join(differences[:4]) + (" ..." if len(differences) > 4 else "")
        raise UserError(
            f"{ckpt_path} holds another architecture than the configured model "
            f"({len(differences)} difference(s): {shown}). Use the model config it was trained "
            f"with (its run dir's .hydra/config.yaml)."
        )


def finish(
    cfg: DictConfig, trainer: L.Trainer, model: ClassificationModule, metrics: dict[str, float]
) -> dict[str, float]:
    """Write `metrics.json` and `plots/` into the run dir, print the final table (rank 0)."""
    if trainer.is_global_zero:
        output_dir = Path(cfg.paths.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        path = output_dir / "metrics.json"
        path.write_text(json.dumps(dict(sorted(metrics.items())), indent=2) + "\n")
        write_plots(trainer, model, output_dir / "plots")
        print_metrics(metrics, output_dir)
    return metrics


def write_plots(trainer: L.Trainer, model: ClassificationModule, plot_dir: Path) -> None:
    """plots/confusion_matrix.png (after a test) and plots/curves.png (after training), also
    sent to TensorBoard and Weights & Biases when they are logging."""
    import matplotlib.pyplot as plt

    figures = {}
    if model.test_confusion_matrix is not None:
        names = model.hparams.class_names or [str(i) for i in range(model.hparams.num_classes)]
        path = plot_dir / "confusion_matrix.png"
        figures[path] = plots.confusion_matrix(model.test_confusion_matrix, names, path)
    history = next((cb for cb in trainer.callbacks if isinstance(cb, EpochHistory)), None)
    if history is not None and history.epochs:  # an evaluation has none
        path = plot_dir / "curves.png"
        figures[path] = plots.curves(history.epochs, path)
    for path, figure in figures.items():
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_figure(path.stem, figure)
            elif isinstance(logger, WandbLogger):
                logger.log_image(key=path.stem, images=[str(path)])
        plt.close(figure)


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit, then test the best checkpoint. Returns the final metrics (`metrics.json`)."""
    if cfg.extras.get("print_config"):
        print_config(cfg, save_to=Path(cfg.paths.output_dir) / "config_tree.log")
    seed(cfg)
    datamodule = build_datamodule(cfg)
    model = build_model(cfg, datamodule)
    trainer = build_trainer(cfg)

    metrics: dict[str, float] = {}
    if cfg.get("train"):
        ckpt_path = resume_checkpoint(cfg, model, datamodule)
        fit(trainer, model, datamodule, ckpt_path=ckpt_path)
        if ckpt_path and not any(k.startswith("val/") for k in trainer.callback_metrics):
            # The checkpoint had reached max_epochs already: nothing was trained or validated.
            log.warning(
                f"{ckpt_path} already reached trainer.max_epochs={trainer.max_epochs}: nothing "
                f"left to train (raise trainer.max_epochs to train on). Validating it instead."
            )
            trainer.validate(model, datamodule=datamodule)
        metrics.update(_float_metrics(trainer))

    if cfg.get("test"):
        # The best checkpoint: the one callback that watches a metric.
        monitors = [cb for cb in trainer.checkpoint_callbacks if getattr(cb, "monitor", None)]
        best = monitors[0].best_model_path if monitors else ""
        if cfg.get("train") and not best:
            log.warning("No checkpoint was saved (e.g. fast_dev_run): testing the final weights.")
        with stopped_by_sigterm(trainer, "testing"):
            trainer.test(model, datamodule=datamodule, ckpt_path=best or None, weights_only=True)
        metrics.update(_float_metrics(trainer))

    return finish(cfg, trainer, model, metrics)


def model_from_checkpoint(
    checkpoint: dict[str, Any], datamodule: InMemoryImageDataModule, ckpt_path: str
) -> ClassificationModule:
    """Rebuild the trained model from the checkpoint's own hyperparameters and weights."""
    check_same_dataset(checkpoint, datamodule, ckpt_path)
    model = ClassificationModule(**checkpoint["hyper_parameters"])
    model.load_state_dict(checkpoint["state_dict"])
    return model


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Test a checkpoint on the test split. The network comes from the checkpoint itself."""
    if cfg.extras.get("print_config"):
        print_config(cfg, save_to=Path(cfg.paths.output_dir) / "config_tree.log")
    seed(cfg)
    if not cfg.get("ckpt_path"):
        raise UserError("no checkpoint given: add ckpt_path=<file>, e.g. .../checkpoints/last.ckpt")
    checkpoint = read_checkpoint(cfg.ckpt_path)
    datamodule = build_datamodule(cfg)
    model = model_from_checkpoint(checkpoint, datamodule, cfg.ckpt_path)
    trainer = build_trainer(cfg)
    trainer.test(model, datamodule=datamodule)
    return finish(cfg, trainer, model, _float_metrics(trainer))


def optimized_metric(cfg: DictConfig, metrics: dict[str, float]) -> float | None:
    """The value a sweeper optimizes (`optimized_metric` in the config)."""
    name = cfg.get("optimized_metric")
    if not name:
        return None
    if name not in metrics:
        raise UserError(
            f"optimized_metric={name} was not logged. Logged: {', '.join(sorted(metrics))}."
        )
    value = metrics[name]
    return value if math.isfinite(value) else float("nan")
