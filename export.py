"""Export a checkpoint: `python export.py ckpt_path=<checkpoint> format=onnx|pt2`."""

import hydra
from omegaconf import DictConfig

from litforge.errors import reported


@hydra.main(config_path="conf", config_name="export", version_base="1.3")
@reported  # a mistake in the input: one `error:` line and exit status 1
def main(cfg: DictConfig) -> None:
    from litforge.deploy.export import export  # after composing: see train.py

    export(cfg)


if __name__ == "__main__":
    main()
