"""Export a checkpoint: `python export.py ckpt_path=<checkpoint> format=onnx|pt2`."""

import hydra
from omegaconf import DictConfig

from litforge.errors import reported
from litforge.runs import register_resolvers

register_resolvers()  # ${cwd:} and ${job_id:...} in conf/, before Hydra composes it


@hydra.main(config_path="conf", config_name="export", version_base="1.3")
@reported  # a UserError: one `error:` line, exit status 1; a run folder left empty goes
def main(cfg: DictConfig) -> None:
    from litforge.deploy.export import export  # after composing: see train.py

    export(cfg)


if __name__ == "__main__":
    main()
