"""Serve a model over HTTP: `python serve.py ckpt_path=<checkpoint>` (or `model_path=<export>`)."""

import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from litforge.errors import UserError, reported
from litforge.runs import register_resolvers

register_resolvers()  # ${cwd:} and ${job_id:...} in conf/, before Hydra composes it


@hydra.main(config_path="conf", config_name="serve", version_base="1.3")
@reported  # a UserError: one `error:` line, exit status 1; a run folder left empty goes
def main(cfg: DictConfig) -> None:
    try:
        from litforge.deploy.serve import serve  # LitServe: installed with the [serve] extra
    except ModuleNotFoundError as err:
        raise UserError(f'serve.py needs {err.name}: pip install -e ".[serve]"') from err
    serve(cfg)


if __name__ == "__main__":
    main()
    # The server stopped, all its processes with it. Skip the interpreter's teardown of torch's
    # and Lightning's modules: seconds on a small machine, in which the stopped server would
    # still look alive to `docker stop` or a supervisor.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
