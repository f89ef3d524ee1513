"""Predict the classes of images: `python predict.py ckpt_path=<checkpoint> input=<images>`."""

import hydra
from omegaconf import DictConfig

from litforge.errors import one_line_errors, reported


@one_line_errors  # a mistake in the input: one `error:` line and exit status 1 (errors.py)
@hydra.main(config_path="conf", config_name="predict", version_base="1.3")
@reported  # likewise once the config has composed; a run folder left empty goes
def main(cfg: DictConfig) -> None:
    from litforge.deploy.predict import predict  # after composing: see train.py

    predict(cfg)


if __name__ == "__main__":
    main()
