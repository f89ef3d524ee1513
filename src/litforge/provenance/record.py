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
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)

# Written by scripts/install.sh: the lock file it installed from, and that file's SHA-256.
INSTALLED_FROM = ".installed-from"


# A diff larger than this is not kept (a large binary file changed): the record says so.
MAX_DIFF_BYTES = 10_000_000


def git(root: Path, *args: str) -> bytes | None:
    """`git -C root <args>`'s output, or None: outside a git checkout, without git, or slow."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=10)
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


def changes(root: Path) -> tuple[dict[str, Any], bytes | None]:
    """Whether the checkout's tracked files have uncommitted changes (None: unknown), its
    untracked files, and the changes (`git diff HEAD`) when there are some and they fit."""
    status = git(root, "status", "--porcelain")
    if status is None:
        return {"dirty": None, "note": "git status failed"}, None
    lines = status.decode(errors="replace").splitlines()
    found = {
        "dirty": any(not line.startswith("?? ") for line in lines),  # tracked files changed
        "untracked": [line[3:] for line in lines if line.startswith("?? ")],
    }
    diff = git(root, "diff", "HEAD", "--binary") if found["dirty"] else None
    if found["dirty"] and (diff is None or len(diff) > MAX_DIFF_BYTES):
        found["note"] = "the changes were not saved: git diff failed or passed 10 MB"
        diff = None
    return found, diff


def collect(root: Path, started: datetime.datetime) -> tuple[dict[str, Any], bytes | None]:
    """The provenance of a run started at `started` from the project at `root`, and the
    uncommitted changes (`git diff HEAD`) when there are some."""
    commit = git(root, "rev-parse", "HEAD")
    found, diff = changes(root) if commit else ({}, None)
    cuda = torch.cuda.is_available()
    record = {
        "git": {
            "commit": commit.decode().strip() if commit else None,
            **found,
            **({} if commit else {"note": f"{root} is no git checkout (or git is missing)"}),
        },
        "lock": lock(root),
        "versions": {
            "python": platform.python_version(),
            "torch": str(torch.__version__),  # (a str subclass: YAML writers would tag it)
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
        self.in_trainer = False  # (a command without a Trainer may hand it a checkpoint's state)
        self.trained = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.in_trainer = True
        if self.record is not None or not trainer.is_global_zero:
            return
        try:
            self.record, diff = collect(self.root, self.started)
            self.write(diff)
        except Exception as err:  # (a record is no reason to stop training)
            log.warning(f"provenance: not recorded ({type(err).__name__}: {err})")
            return
        for logger in trainer.loggers:
            logger.log_hyperparams({"provenance": self.record})

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.trained = True  # (the test after training reads this run's own checkpoint)

    def write(self, diff: bytes | None) -> None:
        """provenance.json (and .diff); a run resumed into its folder moves the earlier ones to
        provenance-1.json (-2, ...) first."""
        self.dirpath.mkdir(parents=True, exist_ok=True)
        earlier = self.dirpath / "provenance.json"
        if earlier.exists():
            n = 1
            while (self.dirpath / f"provenance-{n}.json").exists():
                n += 1
            for suffix in (".json", ".diff"):
                if (old := self.dirpath / f"provenance{suffix}").exists():
                    old.rename(self.dirpath / f"provenance-{n}{suffix}")
        if diff is not None:
            (self.dirpath / "provenance.diff").write_bytes(diff)
        earlier.write_text(json.dumps(self.record, indent=2) + "\n")

    def state_dict(self) -> dict[str, Any]:
        git_state = (self.record or {}).get("git", {})
        return {"commit": git_state.get("commit"), "dirty": git_state.get("dirty")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A checkpoint's (resumed, tested by eval.py, or handed over by a command that only
        reads it, with no Trainer): its commit said, and whether it is another than this
        checkout's (a string from the file: shown, never used)."""
        if self.trained or not isinstance(state_dict, Mapping):
            return
        if self.record is not None:
            now = self.record["git"]["commit"]
        elif self.in_trainer:
            return  # (only rank 0 has a record)
        else:  # no Trainer: a command that only reads the checkpoint
            now = (git(self.root, "rev-parse", "HEAD") or b"").decode().strip() or None
        trained = state_dict.get("commit")
        if not (isinstance(trained, str) and re.fullmatch("[0-9a-f]{40}", trained)):
            log.info("The checkpoint names no commit (trained outside a git checkout).")
            return
        dirty = " with uncommitted changes" if state_dict.get("dirty") is True else ""
        log.info(f"The checkpoint was trained at commit {trained}{dirty}.")
        if now is not None and now != trained:
            log.warning(
                f"The checkpoint was trained at commit {trained}, this checkout is at {now}: "
                f"the code may differ (git diff {trained} {now})."
            )
