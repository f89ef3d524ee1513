"""Test a checkpoint: `python eval.py ckpt_path=<file or folder> [data=<its dataset>]`."""

import hydra
from omegaconf import DictConfig

from litforge.errors import one_line_errors, reported


@one_line_errors  # a mistake in the input: one `error:` line and exit status 1 (errors.py)
@hydra.main(config_path="conf", config_name="eval", version_base="1.3")
@reported  # likewise once the config has composed; a run folder left empty goes
def main(cfg: DictConfig) -> None:
    from litforge.pipeline import evaluate  # after composing: see train.py

    evaluate(cfg)


if __name__ == "__main__":
    main()
