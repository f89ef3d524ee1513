"""Train a classifier: `python train.py [group=option ...] [key=value ...]` (see README.md)."""

import sys

import hydra
from omegaconf import DictConfig

from litforge.errors import exit_on_user_error, exit_status
from litforge.pipeline import optimized_metric, train


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
@exit_on_user_error
def main(cfg: DictConfig) -> float | None:
    return optimized_metric(cfg, train(cfg))


if __name__ == "__main__":
    main()
    sys.exit(exit_status())  # non-zero when a job of a sweep (-m) failed
