"""Train a classifier: `python train.py [group=option ...] [key=value ...]` (see README.md)."""

import hydra
from omegaconf import DictConfig

from litforge.errors import reported
from litforge.runs import register_resolvers

register_resolvers()  # ${cwd:} and ${job_id:...} in conf/, before Hydra composes it


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
@reported  # a UserError: one `error:` line, exit status 1; a run folder left empty goes
def main(cfg: DictConfig) -> float | None:
    # Imported once the config is composed: a mistake in it is reported without waiting for
    # torch and Lightning to load.
    from litforge.pipeline import optimized_metric, train

    return optimized_metric(cfg, train(cfg))


if __name__ == "__main__":
    main()
