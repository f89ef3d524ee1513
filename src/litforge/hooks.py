"""What the pipeline calls on the objects a config names, beyond Lightning's own interfaces: a
class takes part by subclassing the mixin (each method's default does nothing), and the pipeline
calls only classes that do (`isinstance`/`issubclass`, no attribute probing). How a feature folder
brings its checks and set-up without the core knowing it. The strategies' own interface, naming a
lost process in one line: `strategies.ReportsLostProcesses`."""

from pathlib import Path  # feature: tracking

# feature: backbones model_parallel parameter_server elastic tuning streaming
from typing import Any


class PreparesRun:  # feature: backbones model_parallel parameter_server elastic tuning
    """A strategy, callback or (when training) network class named by `_target_` in the config:
    `pipeline.prepare_run` calls `prepare_run(cfg)` after the core's config checks, before data is
    read or anything is built. It may refuse settings (UserError, naming the config key) and set
    up what must exist before the Trainer, or fill in config values it needs."""

    @classmethod
    def prepare_run(cls, cfg: Any) -> None:
        """Check and prepare the run of `cfg` (the composed DictConfig; may be changed)."""


class ChecksFit:  # feature: model_parallel
    """A strategy that refuses a model or checkpoint it cannot run: `pipeline.train` calls
    `check_fit(model, ckpt_path)` once the Trainer is built, before its processes start."""

    def check_fit(self, model: Any, ckpt_path: str | None) -> None:
        """Raise a UserError for a model (or checkpoint to resume, when fitting) it cannot run."""


class LogsRunFiles:  # feature: tracking
    """A logger that keeps files: `pipeline.finish` calls `log_run_files(run_dir, best)` on the
    global-zero process once metrics.json is written (`best`: the best checkpoint, or None)."""

    def log_run_files(self, run_dir: Path, best_checkpoint: str | None) -> None:
        """Hand the run folder's files (metrics.json, pictures, the checkpoint) to the logger."""


class KeepsTestIndices:  # feature: streaming
    """A datamodule whose test samples stream in an order no sampler says (an `IterableDataset`):
    it keeps the dataset index of each test sample it hands over, a tensor per batch on the
    device, from the start of each test (`test_indices`). The plots callback reads back the
    images of the mistakes it draws by these indices, `loader.dataset[index]`."""

    test_indices: list[Any]
