"""Serve a model over HTTP: `python serve.py ckpt_path=<checkpoint>` (or `model_path=<export>`)."""

import hydra
from omegaconf import DictConfig

from litforge.errors import UserError, reported


@hydra.main(config_path="conf", config_name="serve", version_base="1.3")
@reported  # a mistake in the input: one `error:` line and exit status 1
def main(cfg: DictConfig) -> None:
    try:
        from litforge.serve import serve  # LitServe: installed with the [serve] extra
    except ModuleNotFoundError as err:
        raise UserError(f'serve.py needs {err.name}: pip install -e ".[serve]"') from err
    serve(cfg)


if __name__ == "__main__":
    main()
