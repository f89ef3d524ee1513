"""Test a checkpoint: `python eval.py ckpt_path=<file> [data=<dataset it was trained on>]`."""

import sys

import hydra
from omegaconf import DictConfig

from litforge.errors import exit_on_user_error, exit_status
from litforge.pipeline import evaluate


@hydra.main(config_path="conf", config_name="eval", version_base="1.3")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    evaluate(cfg)


if __name__ == "__main__":
    main()
    sys.exit(exit_status())  # non-zero when a job of a sweep (-m) failed
