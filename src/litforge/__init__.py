"""litforge: a PyTorch Lightning + Hydra template for image classification."""

import os

from omegaconf import OmegaConf

from litforge.runs import run_dir

__version__ = "0.1.0"

# `${cwd:}`: `-m` resolves `hydra.sweep.dir` before `${hydra:runtime.cwd}` exists.
OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)
OmegaConf.register_new_resolver("run_dir", run_dir, replace=True)
