"""Our own checks raise `UserError`: the run ends in one `error:` line and exit status 1
(`HYDRA_FULL_ERROR=1`: the traceback), through the `reported` decorator under `@hydra.main`.
Hydra's and OmegaConf's own errors (an unknown key or option, a `???` left, an instantiation that
fails) are left to Hydra, which prints them as it always does. Importing this changes nothing."""

import functools
import logging
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any


class UserError(Exception):
    """A problem the user can fix (a missing file, a bad value). The message says what and how."""


def user_error(err: BaseException) -> UserError | None:
    """`err` if it is a UserError, or the UserError that caused it (a constructor's, which
    Hydra's `instantiate` raises again as an InstantiationException from it)."""
    while err is not None and not isinstance(err, UserError):
        err = err.__cause__
    return err


def reported(task):
    """Decorate an entry point's task, under `@hydra.main`: a UserError ends in one `error:`
    line and exit status 1 (the traceback: in the log file), and a run folder that a failure left
    empty goes. Other errors go on to Hydra, which prints them."""

    @functools.wraps(task)
    def run(cfg: Any) -> Any:
        new_folder = _new_run_dir(cfg)
        try:
            return task(cfg)
        except Exception as err:
            if _hydra_mode() == "MULTIRUN":  # Hydra records the job's failure
                raise
            root = logging.getLogger()
            log_files = [
                h for h in root.handlers if isinstance(h, logging.FileHandler) and h.stream
            ]
            found = user_error(err)
            line = str(found) if found is not None else f"{type(err).__name__}: {err}"
            for handler in log_files:  # the traceback: in train.log, not on the console
                handler.stream.write(f"error: {line}\n{traceback.format_exc()}")
                handler.flush()
            full = os.environ.get("HYDRA_FULL_ERROR") == "1"  # then the folder and its log stay
            if not full and new_folder and _holds_only_hydra_files(new_folder, empty_logs=False):
                for handler in log_files:  # the log files in it: closed first
                    if new_folder in Path(handler.baseFilename).parents:
                        root.removeHandler(handler)
                        handler.close()
                shutil.rmtree(new_folder, ignore_errors=True)
            if found is None or full:
                raise
            say_error(line)
            sys.exit(1)

    return run


def _hydra_mode() -> str | None:  # RUN or MULTIRUN while Hydra runs the task
    from hydra.core.hydra_config import HydraConfig

    return getattr(HydraConfig.get().mode, "name", None) if HydraConfig.initialized() else None


def _new_run_dir(cfg: Any) -> Path | None:
    """The run folder if Hydra has just made it; None for a sweep's job (the summary lists it),
    a multi-process job's processes but the first, and a folder reentered (a restarted job's,
    or `hydra.run.dir=<a run>`)."""
    from hydra.core.hydra_config import HydraConfig

    kept = _hydra_mode() != "RUN"
    kept = kept or bool(cfg.get("sweep_name"))  # feature: sweeps
    if kept:
        return None
    ranks = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")  # Lightning's DDP, torchrun, SLURM
    if any(os.environ.get(rank, "0") != "0" for rank in ranks):
        return None
    folder = Path(HydraConfig.get().runtime.output_dir)
    return folder if _holds_only_hydra_files(folder, empty_logs=True) else None


def _holds_only_hydra_files(folder: Path, empty_logs: bool) -> bool:
    """`folder` holds nothing but `.hydra/*.yaml` and `*.log` files (`empty_logs`: empty ones)."""
    try:
        for entry in folder.iterdir():
            if entry.name == ".hydra" and entry.is_dir():
                hydras = all(f.suffix == ".yaml" and f.is_file() for f in entry.iterdir())
            else:
                log = entry.suffix == ".log" and entry.is_file() and not entry.is_symlink()
                hydras = log and not (empty_logs and entry.stat().st_size)
            if not hydras:
                return False
    except OSError:  # gone, or not a folder
        return False
    return True


def say_error(line: str) -> None:
    # One write: `print` writes the newline apart, and unbuffered another process can cut in.
    sys.stderr.write(f"error: {line}\n")
    sys.stderr.flush()
