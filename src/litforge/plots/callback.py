"""The `ClassificationPlots` callback (`callbacks.plots`, in the default callbacks)."""

from pathlib import Path
from typing import Any

import lightning as L

from litforge.plots import figures


class ClassificationPlots(L.Callback):
    """`<dirpath>/curves.png` after training, `<dirpath>/confusion_matrix.png` after testing (rank
    0; also to TensorBoard). Epochs are recorded here (no logger needed), kept in checkpoints,
    and read at the first chance after `on_train_epoch_end`, as later hooks may still log them."""

    NAMES = ("train/loss", "train/acc", "val/loss", "val/acc")

    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)
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

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        matrix = getattr(pl_module, "test_confusion_matrix", None)  # ClassificationModule's
        if trainer.is_global_zero and matrix is not None:
            names = pl_module.hparams.class_names or [str(i) for i in range(len(matrix))]
            path = self.dirpath / "confusion_matrix.png"
            self._publish(trainer, figures.confusion_matrix(matrix, names, path), path)

    @staticmethod
    def _publish(trainer: L.Trainer, figure: Any, path: Path) -> None:
        from lightning.pytorch.loggers import TensorBoardLogger

        for logger in trainer.loggers:  # (loggers that keep files get them at the run's end)
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_figure(path.stem, figure)
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
