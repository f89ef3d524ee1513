"""litforge: a PyTorch Lightning + Hydra template for image classification."""

import os
from datetime import datetime

from omegaconf import OmegaConf

__version__ = "0.1.0"


def run_id() -> str:
    """The name of a run's folder: the job id when a cluster launcher gives one, else the time.

    Every process of a multi-node job computes this for itself; a shared job id puts them all
    into one folder, where timestamps taken on different machines could differ by a second.
    """
    if os.environ.get("SLURM_JOB_ID"):
        array = os.environ.get("SLURM_ARRAY_TASK_ID")
        return f"slurm-{os.environ['SLURM_JOB_ID']}" + (f"-{array}" if array else "")
    if os.environ.get("TORCHELASTIC_RUN_ID", "none") != "none":
        return f"torchrun-{os.environ['TORCHELASTIC_RUN_ID']}"
    return datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def run_dir(runs_root: str, ckpt_path: str | None, overrides=None) -> str:
    """`${run_dir:<runs root>,${ckpt_path},${hydra.overrides.task}}`: a new `<run id>` folder,
    or the run that `ckpt_path` resumes (litforge.checkpointing.run_dir)."""
    from litforge.checkpointing import run_dir as resolve

    return resolve(runs_root, ckpt_path, overrides, run_id())


# `${cwd:}`: the directory the run started in. Hydra's `${hydra:runtime.cwd}` can't be used for
# `hydra.sweep.dir`, which `-m` resolves before Hydra's own config exists.
OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)
OmegaConf.register_new_resolver("run_id", run_id, replace=True)
OmegaConf.register_new_resolver("run_dir", run_dir, replace=True)
