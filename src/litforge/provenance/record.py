"""`<run>/provenance.json`: the git commit (and `provenance.diff` when the tree had uncommitted
changes), the lock file installed from, the Python, torch, Lightning, CUDA and cuDNN versions,
the CPUs and GPUs, the command line and the start time. Written once by rank 0 from `setup`,
sent to every logger's hyper-parameters, and kept in checkpoints."""

import datetime
import hashlib
import json
import logging
import os
import platform
import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)

# Written by scripts/install.sh: the lock file it installed from, and that file's SHA-256.
INSTALLED_FROM = ".installed-from"


def git(root: Path, *args: str) -> str | None:
    """`git -C root <args>`'s output, or None outside a git checkout or without git."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def lock(root: Path) -> dict[str, Any]:
    """The lock file `scripts/install.sh` installed from, its hash then, and whether the
    checkout's file still has it."""
    try:
        name, digest = (root / INSTALLED_FROM).read_text().split()
    except (OSError, ValueError):
        return {"file": None, "note": "not installed with scripts/install.sh"}
    try:
        now = hashlib.sha256((root / name).read_bytes()).hexdigest()
    except OSError:
        now = None
    return {"file": name, "sha256": digest, "matches_checkout": now == digest}


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def collect(root: Path, started: datetime.datetime) -> tuple[dict[str, Any], str | None]:
    """The provenance of a run started at `started` from the project at `root`, and the
    uncommitted changes (`git diff HEAD`) when there are some."""
    commit = git(root, "rev-parse", "HEAD")
    status = git(root, "status", "--porcelain") if commit else None
    dirty = bool(status and status.strip())
    diff = git(root, "diff", "HEAD", "--binary") if dirty else None
    untracked = [line[3:] for line in (status or "").splitlines() if line.startswith("?? ")]
    cuda = torch.cuda.is_available()
    record = {
        "git": {
            "commit": commit.strip() if commit else None,
            "dirty": dirty,
            "untracked": untracked,
            **({} if commit else {"note": f"{root} is no git checkout (or git is missing)"}),
        },
        "lock": lock(root),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "lightning": version("lightning"),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
        },
        "hardware": {
            "cpus": os.cpu_count(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        },
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "started": started.isoformat(timespec="seconds"),
    }
    return record, diff


class RecordProvenance(L.Callback):
    """Write `<dirpath>/provenance.json` (and `provenance.diff`) once, from rank 0, and send it
    to the loggers; checkpoints keep it (`state_dict`), so a checkpoint names its commit."""

    def __init__(self, dirpath: str, root: str | None = None) -> None:
        self.dirpath = Path(dirpath)
        # The project: where the entry point is (`python train.py` from anywhere).
        self.root = Path(root or Path(sys.argv[0]).resolve().parent)
        self.started = datetime.datetime.now(datetime.timezone.utc).astimezone()
        self.record: dict[str, Any] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.record is not None or not trainer.is_global_zero:
            return
        self.record, diff = collect(self.root, self.started)
        self.dirpath.mkdir(parents=True, exist_ok=True)
        if diff is not None:
            (self.dirpath / "provenance.diff").write_text(diff)
        (self.dirpath / "provenance.json").write_text(json.dumps(self.record, indent=2) + "\n")
        for logger in trainer.loggers:
            logger.log_hyperparams({"provenance": self.record})

    def state_dict(self) -> dict[str, Any]:
        git_state = (self.record or {}).get("git", {})
        return {"commit": git_state.get("commit"), "dirty": git_state.get("dirty")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A checkpoint's (resumed, or tested by eval.py): its commit said, and whether it is
        another than this run's (a string from the file: shown, never used)."""
        if self.record is None:  # (only rank 0 has one)
            return
        trained, now = state_dict.get("commit"), self.record["git"]["commit"]
        if not (isinstance(trained, str) and re.fullmatch("[0-9a-f]{40}", trained)):
            log.info("The checkpoint names no commit (trained outside a git checkout).")
            return
        dirty = " with uncommitted changes" if state_dict.get("dirty") is True else ""
        log.info(f"The checkpoint was trained at commit {trained}{dirty}.")
        if now != trained:
            log.warning(
                f"The checkpoint was trained at commit {trained}, this run is at {now}: the "
                f"code may differ (git diff {trained} {now})."
            )
