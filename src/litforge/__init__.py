"""litforge: a PyTorch Lightning + Hydra template for image classification."""

import os

from omegaconf import OmegaConf

from litforge.runs import run_dir

__version__ = "0.1.0"

# The resolvers the configs use. `${run_dir:...}`: where a run writes (litforge.runs.run_dir).
# `${cwd:}`: the directory the run started in (Hydra's `${hydra:runtime.cwd}` can't be used for
# `hydra.sweep.dir`, which `-m` resolves before Hydra's own config exists).
OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)
OmegaConf.register_new_resolver("run_dir", run_dir, replace=True)
