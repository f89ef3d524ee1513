"""Train a classifier: `python train.py [group=option ...] [key=value ...]` (see README.md)."""

import hydra
from omegaconf import DictConfig

from litforge.errors import one_line_errors, reported


@one_line_errors  # a mistake in the input: one `error:` line and exit status 1 (errors.py)
@hydra.main(config_path="conf", config_name="train", version_base="1.3")
@reported  # likewise once the config has composed; a run folder left empty goes
def main(cfg: DictConfig) -> float | None:
    # Imported once the config is composed: a mistake in it is reported without waiting for
    # torch and Lightning to load.
    from litforge.pipeline import optimized_metric, train

    return optimized_metric(cfg, train(cfg))


if __name__ == "__main__":
    main()
