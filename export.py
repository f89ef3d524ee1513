"""Export a checkpoint: `python export.py ckpt_path=<checkpoint> format=onnx|pt2`."""

import hydra
from omegaconf import DictConfig

from litforge.errors import one_line_errors, reported


@one_line_errors  # a mistake in the input: one `error:` line and exit status 1 (errors.py)
@hydra.main(config_path="conf", config_name="export", version_base="1.3")
@reported  # likewise once the config has composed; a run folder left empty goes
def main(cfg: DictConfig) -> None:
    from litforge.deploy.export import export  # after composing: see train.py

    export(cfg)


if __name__ == "__main__":
    main()
