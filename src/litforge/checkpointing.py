"""Checkpoints that survive being killed, and finding the one to resume from.

- `AtomicCheckpointIO`: a checkpoint is written to a temporary file beside its target, flushed
  to disk, then renamed over it, so a kill mid-write leaves the previous checkpoint whole.
  (Lightning's own writer stages the file in the system temp dir, which on clusters is often
  another file system: its final move is then a plain, interruptible copy.)
- `read_checkpoint`: load a checkpoint file the safe way (`weights_only=True`), or say in one line
  why the file is not one.
- `resume_path`: what `ckpt_path=last` means: the newest checkpoint of the run that loads.
- `run_dir`: the `${run_dir:...}` resolver of conf/hydra/default.yaml, which sends `ckpt_path=last`
  back into the folder of the run it resumes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from litforge.errors import UserError

log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
        try:
            with partial.open("wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)  # atomic on POSIX within one file system
        finally:
            partial.unlink(missing_ok=True)


def read_checkpoint(path: str | Path, key: str = "ckpt_path") -> dict[str, Any]:
    """The checkpoint in `path`, or a UserError saying (for `key`) why it cannot be used."""
    path = Path(path).expanduser()
    if path.is_dir():  # strategy=model_parallel with save_distributed_checkpoint=true
        raise UserError(
            f"{key}={path} is a folder of shards. Make one file of it with "
            f"`python -m lightning.fabric.utilities.consolidate_checkpoint {path}`, then use "
            f"{key}={path}.consolidated"
        )
    if not path.is_file():
        raise UserError(f"{key}={path}: no such file.")
    try:
        # mmap: tensors are read when used, so checking a large checkpoint costs little.
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch.load raises many kinds on foreign bytes
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"{key}={path} is not a readable checkpoint ({first_line[:200]}). Point it at a "
            f".ckpt file written by train.py (<run dir>/checkpoints/)."
        ) from err
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise UserError(
            f"{key}={path} is a torch file but not a Lightning checkpoint (no 'state_dict'). "
            f"Point it at a .ckpt file written by train.py (<run dir>/checkpoints/)."
        )
    return checkpoint


def resume_path(checkpoint_dir: Path) -> Path:
    """The newest checkpoint in `checkpoint_dir` that loads; broken ones are named and skipped."""
    candidates = sorted(
        checkpoint_dir.glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for path in candidates:
        if path.is_dir():  # model_parallel's folder of shards, whole once its .metadata exists
            if (path / ".metadata").is_file():
                log.info(f"Resuming from {path} (a folder of shards)")
                return path
            log.warning(f"Skipping {path}: a folder of shards without .metadata (cut off)")
            continue
        try:
            checkpoint = read_checkpoint(path)
        except UserError as err:
            log.warning(f"Skipping {path}: {err}")
            continue
        log.info(
            f"Resuming from {path} (epoch {checkpoint.get('epoch')}, "
            f"step {checkpoint.get('global_step')})"
        )
        return path
    raise UserError(
        f"ckpt_path=last: no checkpoint to resume in {checkpoint_dir}. Run the same command "
        f"without ckpt_path to start, or give ckpt_path=<file>."
    )


def _same_command(run: Path, overrides: list[str]) -> bool:
    saved = run / ".hydra" / "overrides.yaml"
    if not saved.is_file():
        return False
    from omegaconf import OmegaConf

    return _without_resume(list(OmegaConf.load(saved))) == _without_resume(overrides)


def _without_resume(overrides: list[str]) -> list[str]:
    return [o for o in overrides if not o.startswith(("ckpt_path=", "hydra.run.dir="))]


def _newest_checkpoint_time(run: Path) -> float:
    return max(p.stat().st_mtime for p in run.glob("checkpoints/*.ckpt"))


def run_dir(runs_root: str, ckpt_path: str | None, overrides: Any, new_run: str) -> str:
    """The run folder: `<runs_root>/<new_run>` for a new run. With `ckpt_path=last`, the newest
    run under `runs_root` started with the same overrides (ckpt_path aside) that holds a
    checkpoint; with a checkpoint file inside a run under `runs_root`, that run."""
    root = Path(runs_root)
    if ckpt_path == "last":
        runs = [
            run
            for run in (root.iterdir() if root.is_dir() else [])
            if any(run.glob("checkpoints/*.ckpt")) and _same_command(run, list(overrides or []))
        ]
        if runs:
            return str(max(runs, key=_newest_checkpoint_time))
    elif ckpt_path:
        path = Path(ckpt_path).expanduser().resolve()
        if path.parent.name == "checkpoints" and path.parent.parent.parent == root.resolve():
            return str(path.parent.parent)
    return str(root / new_run)
