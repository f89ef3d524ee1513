"""litforge: a PyTorch Lightning + Hydra template for image classification."""

import os

from omegaconf import OmegaConf

__version__ = "0.1.0"

# `${cwd:}` in configs: the directory the run started in. Hydra's `${hydra:runtime.cwd}` can't be
# used for `hydra.sweep.dir`, which `-m` resolves before Hydra's own config exists.
OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)
