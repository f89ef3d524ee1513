"""litforge: a PyTorch Lightning + Hydra template for image classification."""

import os

from omegaconf import OmegaConf

__version__ = "0.1.0"


def run_dir(runs_root: str, ckpt_path: str | None, overrides=None, fits=True) -> str:
    """`${run_dir:...}`: a new run's folder, or the run `ckpt_path` resumes (`resume.run_dir`).
    Imported when first resolved: `litforge.resume` needs torch and Lightning."""
    from litforge.resume import run_dir as resolve

    return resolve(runs_root, ckpt_path, overrides, fits)


def resume_default() -> str | None:
    """`${resume_default:}`: `auto` where a launcher restarts jobs (`elastic.resume_default`)."""
    from litforge.elastic import resume_default as default

    return default()


# The resolvers the configs use. `${cwd:}`: the directory the run started in (Hydra's
# `${hydra:runtime.cwd}` can't be used for `hydra.sweep.dir`, which `-m` resolves before Hydra's
# own config exists).
OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)
OmegaConf.register_new_resolver("run_dir", run_dir, replace=True)
OmegaConf.register_new_resolver("resume_default", resume_default, replace=True)
