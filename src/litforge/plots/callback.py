"""The `ClassificationPlots` callback (`callbacks.plots`, in the default callbacks)."""

import logging
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from litforge.plots import figures
from litforge.plots.mistakes import Mistakes, images, readable, test_indices
from litforge.settings import NonNegativeInt

log = logging.getLogger(__name__)


class ClassificationPlots(L.Callback):
    """`<dirpath>/curves.png` after training, `<dirpath>/confusion_matrix.png` after testing (rank
    0; also to TensorBoard). Epochs are recorded here (no logger needed), kept in checkpoints,
    and read at the first chance after `on_train_epoch_end`, as later hooks may still log them."""

    NAMES = ("train/loss", "train/acc", "val/loss", "val/acc")

    def __init__(self, dirpath: str, mistakes: NonNegativeInt = 16) -> None:
        self.dirpath = Path(dirpath)
        self.mistakes = mistakes  # images in plots/mistakes.png (0: none)
        self.found: Mistakes | None = None
        self._logits: torch.Tensor | None = None
        self._hook: Any = None
        self.epochs: dict[int, dict[str, float]] = {}
        self._ended: int | None = None  # an epoch whose statistics are yet to be read
        self.trainer: L.Trainer | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.trainer = trainer

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._ended = trainer.current_epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._record()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._record()
        if trainer.is_global_zero and self.epochs:
            path = self.dirpath / "curves.png"
            self._publish(trainer, figures.curves(self.epochs, path), path)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loaders = trainer.test_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        if not readable(trainer, loader):
            return  # no sample index to read the images back by: no mistakes.png
        if self.mistakes:  # the module's output, as the test step computes it (not run again)
            self.found = Mistakes(self.mistakes, pl_module.device)
            self._hook = pl_module.register_forward_hook(self._keep_logits)

    def _keep_logits(self, module: Any, inputs: Any, output: Any) -> None:
        self._logits = output if isinstance(output, torch.Tensor) else None

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
        batch_idx: int, dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        logits, labels = self._logits, batch[1]
        if self.found is not None and logits is not None and logits.shape[0] == len(labels):
            self.found.update(logits, labels)
        self._logits = None

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        names = pl_module.hparams.get("class_names")
        matrix = getattr(pl_module, "test_confusion_matrix", None)  # ClassificationModule's
        if trainer.is_global_zero and matrix is not None:
            names = names or [str(i) for i in range(len(matrix))]
            path = self.dirpath / "confusion_matrix.png"
            self._publish(trainer, figures.confusion_matrix(matrix, names, path), path)
        if self.found is not None:
            try:
                self._draw_mistakes(trainer, names)
            except Exception as err:  # (a picture is no reason to fail a run; a dataset of
                log.warning(f"plots/mistakes.png not drawn: {type(err).__name__}: {err}")  # yours)

    def _draw_mistakes(self, trainer: L.Trainer, names: Any) -> None:
        self._hook.remove()
        loaders = trainer.test_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        rows = self.found.gathered(trainer, test_indices(trainer, loader))  # (all processes)
        self.found = None
        if not trainer.is_global_zero or not rows:
            return
        name = (lambda c: str(names[c])[:24]) if names else str  # (a caption fits its image)
        titles = [f"true: {name(y)}\npredicted: {name(p)} ({c:.2f})" for _, y, p, c in rows]
        path = self.dirpath / "mistakes.png"
        self._publish(trainer, figures.mistakes(images(loader, rows), titles, path), path)

    @staticmethod
    def _publish(trainer: L.Trainer, figure: Any, path: Path) -> None:
        from lightning.pytorch.loggers import TensorBoardLogger

        drawn_by_pillow = not hasattr(figure, "savefig")  # (mistakes.png; the others: pyplot's)
        for logger in trainer.loggers:  # (loggers that keep files get them at the run's end)
            if isinstance(logger, TensorBoardLogger) and drawn_by_pillow:
                logger.experiment.add_image(path.stem, np.asarray(figure), dataformats="HWC")
            elif isinstance(logger, TensorBoardLogger):
                logger.experiment.add_figure(path.stem, figure)
        if not drawn_by_pillow:
            figures.close(figure)

    def _record(self) -> None:
        if self._ended is None:
            return
        metrics = self.trainer.callback_metrics
        self.epochs[self._ended] = {n: float(metrics[n]) for n in self.NAMES if n in metrics}
        self._ended = None

    def state_dict(self) -> dict[str, Any]:
        self._record()  # checkpoints are written after the module's epoch-end hook
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epochs = dict(state_dict["epochs"])
