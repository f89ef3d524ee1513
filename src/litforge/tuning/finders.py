"""Lightning's `LearningRateFinder` and `BatchSizeFinder` callbacks (what `Tuner.lr_find` and
`Tuner.scale_batch_size` run), with what a run of this template records of them, and refused in
one line where they cannot run."""

import json
import logging
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder
from omegaconf import DictConfig

from litforge.checks import accelerator_is_cpu
from litforge.errors import UserError
from litforge.hooks import PreparesRun
from litforge.settings import Positive, PositiveInt

log = logging.getLogger(__name__)


def check_one_process(cfg: DictConfig, option: str) -> None:
    trainer = cfg.trainer
    devices = trainer.devices if isinstance(trainer.devices, int) else 2  # (a list: several)
    if devices * trainer.get("num_nodes", 1) > 1:
        raise UserError(
            f"tune={option} runs in one process (Lightning's finder): add trainer.devices=1 "
            f"trainer.num_nodes=1, then train on several with the rate or size it found."
        )


class FindLearningRate(LearningRateFinder, PreparesRun):
    """Before training, Lightning's learning-rate range test on the configured model and data:
    `<dirpath>/lr_find.png` (loss against rate) and `lr_find.json`, the suggestion in the log
    and in `metrics.json` (`tune/lr`). `apply`: then train at the suggested rate (the
    checkpoints' and loggers' `optimizer.lr`); else stop there."""

    def __init__(
        self,
        dirpath: str,
        apply: bool = False,
        min_lr: Positive = 1e-6,
        max_lr: Positive = 1.0,
        num_training_steps: PositiveInt = 100,
        early_stop_threshold: Positive | None = 4.0,
    ) -> None:
        super().__init__(
            min_lr=min_lr,
            max_lr=max_lr,
            num_training_steps=num_training_steps,
            early_stop_threshold=early_stop_threshold,
            update_attr=False,  # (our module's rate is `optimizer.lr`: set below)
        )
        self.dirpath, self.apply = Path(dirpath), apply
        self.rate: float | None = None

    @classmethod
    def prepare_run(cls, cfg: DictConfig) -> None:
        check_one_process(cfg, "lr")
        for key, node in (cfg.get("callbacks") or {}).items():  # (ours, under any name)
            if node and str(node.get("_target_", "")).endswith(f".{cls.__name__}"):
                low, high = node.get("min_lr", 1e-6), node.get("max_lr", 1.0)
                if low >= high:
                    raise UserError(
                        f"callbacks.{key}.min_lr={low} must be below callbacks.{key}.max_lr={high}."
                    )
        if not isinstance((cfg.model.get("optimizer") or {}).get("lr"), (int, float)):
            raise UserError("tune=lr sets model.optimizer.lr: the optimizer must take `lr`.")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.optimal_lr is not None or self.rate is not None:  # found before a resume
            return
        super().on_fit_start(trainer, pl_module)  # Lightning's range test, weights restored after
        found = self.optimal_lr
        rate = found.suggestion() if found is not None else None
        if rate is None:
            raise UserError(
                "tune=lr found no rate: the range test stopped after too few steps (the loss "
                "diverged early, or trainer.max_epochs ran out: it runs within them). Raise "
                "trainer.max_epochs, callbacks.lr_finder.num_training_steps or "
                "early_stop_threshold, or lower max_lr."
            )
        swept = f"{found.results['lr'][0]:.3g} to {found.results['lr'][-1]:.3g}"
        if trainer.is_global_zero:
            self.record(found, rate)
            log.info(f"Learning-rate finder: suggests {rate:.3g} (swept {swept}): {self.dirpath}")
        self.rate = rate
        if self.apply:
            pl_module.hparams.optimizer["lr"] = rate  # (checkpoints keep it)
            trainer.strategy.setup_optimizers(trainer)  # the optimizer and scheduler, at `rate`
            for logger in trainer.loggers:  # beside the run config they have
                logger.log_hyperparams({"tune/lr": rate})
            log.info(f"Training at model.optimizer.lr={rate:.3g}.")
        else:
            trainer.should_stop = True  # the finder only (tune.apply=true: train at it)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Into metrics.json with the run's other final metrics (Lightning's callback metrics,
        # which the fit loop resets when it starts: so here, at the end).
        if self.rate is not None:
            trainer.callback_metrics["tune/lr"] = torch.tensor(self.rate)

    def record(self, found: Any, rate: float) -> None:
        import matplotlib

        matplotlib.use("Agg")  # (no display needed)
        import matplotlib.pyplot as plt

        self.dirpath.mkdir(parents=True, exist_ok=True)
        figure = found.plot(suggest=True)
        figure.axes[0].set_title(f"Learning-rate range test: suggestion {rate:.3g}")
        figure.savefig(self.dirpath / "lr_find.png")
        plt.close(figure)
        results = {"suggestion": rate, "lr": found.results["lr"], "loss": found.results["loss"]}
        (self.dirpath / "lr_find.json").write_text(json.dumps(results) + "\n")

    def state_dict(self) -> dict[str, Any]:
        return {"suggestion": self.rate}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A resumed run goes on at the rate found before (its checkpoint's `optimizer.lr`),
        without searching again."""
        rate = state_dict.get("suggestion") if isinstance(state_dict, dict) else None
        self.rate = float(rate) if isinstance(rate, float) else None


class FindBatchSize(BatchSizeFinder, PreparesRun):
    """Lightning's batch-size finder (`data.batch_size`, grown by powers of 2 until the
    accelerator's memory runs out): it sizes batches for a GPU's memory."""

    def __init__(
        self, mode: Literal["power", "binsearch"] = "power", max_trials: PositiveInt = 25
    ) -> None:
        super().__init__(mode=mode, max_trials=max_trials, batch_arg_name="batch_size")

    @classmethod
    def prepare_run(cls, cfg: DictConfig) -> None:
        if accelerator_is_cpu(str(cfg.trainer.accelerator)):
            raise UserError(
                "tune=batch_size sizes batches for an accelerator's memory: run it on a GPU "
                "(trainer.accelerator=gpu); on CPUs, choose data.batch_size yourself."
            )
        check_one_process(cfg, "batch_size")
