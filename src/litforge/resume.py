"""Stopping on SIGTERM, and finding the checkpoint a run continues from, checked to fit the
configured model and data: `ckpt_path=last`, the newest of this run's folder or else of the newest
earlier run of the same command; `ckpt_path=auto`, the newest of the job's own folder (named by
the cluster's job id under a restarting launcher), if any."""

import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import OmegaConf

from litforge import checkpoints
from litforge.errors import UserError
from litforge.models.classifier import LIGHTNING_SCHEDULER_SETTINGS

log = logging.getLogger(__name__)
# Once per job: Lightning knows the rank from the launcher's environment before the strategy does.
info_on_rank_zero = rank_zero_only(log.info)
warning_on_rank_zero = rank_zero_only(log.warning)


@contextmanager
def stopped_by_sigterm(trainer: L.Trainer, what: str) -> Iterator[None]:
    """Exit with 143 (128 + SIGTERM, what schedulers expect), saying so, where Lightning's
    SIGTERMException exits with 0 (up to 2.6.6, Lightning #19916)."""
    try:
        yield
    except SIGTERMException:
        if trainer.is_global_zero:
            saved = [cb for cb in trainer.callbacks if isinstance(cb, checkpoints.LastCheckpoint)]
            where = f"saved to {saved[0].path}" if saved else "not saved"
            log.warning(
                f"Stopped while {what} at epoch {trainer.current_epoch}, step "
                f"{trainer.global_step}; checkpoint {where}: {how_to_resume()}."
            )
        sys.exit(143)


def how_to_resume() -> str:
    return "to resume, run the same command with ckpt_path=last"


def newest_loadable(
    checkpoint_dir: Path, required: bool = True, into: Path | None = None
) -> Path | None:
    """The newest checkpoint that loads (broken ones named and skipped); None if not `required`.
    `into`: the folder of the run that resumes it, when another."""
    for path in sorted(checkpoint_dir.glob("*.ckpt"), key=lambda p: -p.stat().st_mtime):
        if path.is_dir() and not checkpoints.is_whole(path):
            log.warning(f"Skipping {path}: a folder of shards cut off while written")
            continue
        try:
            ckpt = {} if path.is_dir() else checkpoints.read_checkpoint(path)
        except UserError as err:
            log.warning(f"Skipping {path}: {err}")
            continue
        where = f"epoch {ckpt['epoch']}, step {ckpt['global_step']}" if ckpt else "shards"
        elsewhere = f"; this run writes into {into}" if into else ""
        info_on_rank_zero(f"Resuming from {path} ({where}){elsewhere}")
        return path
    if not required:
        return None
    if any(checkpoint_dir.glob("*.ckpt")):
        raise UserError(
            f"ckpt_path=last: none of the checkpoints in {checkpoint_dir} loads (the warnings "
            f"above say why). Fix what they name, or give ckpt_path=<file>."
        )
    raise UserError(
        f"ckpt_path=last: no checkpoint to resume in {checkpoint_dir}. Run the same command "
        f"without ckpt_path to start, or give ckpt_path=<file>."
    )


def auto_checkpoint(output_dir: str, fitting: bool = True) -> Path | None:
    """`ckpt_path=auto`: the newest checkpoint of this run that loads, or None to start fresh."""
    folder = Path(output_dir) / "checkpoints"
    found = newest_loadable(folder, required=False) if folder.is_dir() else None
    if found is None and not fitting:
        raise UserError(
            f"ckpt_path=auto: no checkpoint in {folder} to test (train=false). Give "
            f"ckpt_path=<file or folder>."
        )
    if found is None:
        info_on_rank_zero(f"No checkpoint in {folder}, starting fresh")
    return found


def last_checkpoint(output_dir: Path, command: list[str] | None = None) -> Path:
    """`ckpt_path=last`: the newest checkpoint that loads in this run's folder (one given with
    `hydra.run.dir`), else in the newest earlier run beside it of the same `command` (overrides
    but ckpt_path; None: this run's). The run writes into its own folder either way."""
    own = output_dir / "checkpoints"
    if any(own.glob("*.ckpt")):
        return newest_loadable(own)
    if command is None:  # in the task: Hydra's record of this run's overrides
        from hydra.core.hydra_config import HydraConfig

        command = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    runs = [
        run
        for run in (output_dir.parent.iterdir() if output_dir.parent.is_dir() else [])
        if run != output_dir and _newest_change(run) and _command(run) == _command_of(command)
    ]
    for run in sorted(runs, key=_newest_change, reverse=True):
        if found := newest_loadable(run / "checkpoints", required=False, into=output_dir):
            return found
    if runs:
        raise UserError(
            f"ckpt_path=last: the checkpoints of the earlier runs of this command in "
            f"{output_dir.parent} do not load (the warnings above say why). Fix what they name, "
            f"or give ckpt_path=<file>."
        )
    raise UserError(
        f"ckpt_path=last: no earlier run of this command (the same overrides, ckpt_path aside) "
        f"has a checkpoint in {output_dir.parent}. With other overrides (more epochs), give "
        f"ckpt_path=<its folder>/checkpoints/last.ckpt."
    )


def _newest_change(run: Path) -> float:  # of the run's checkpoints; 0 without one
    return max((p.stat().st_mtime for p in run.glob("checkpoints/*.ckpt")), default=0)


def _command(run: Path) -> list[str] | None:  # the overrides an earlier run was started with
    saved = run / ".hydra" / "overrides.yaml"
    return _command_of(OmegaConf.load(saved)) if saved.is_file() else None


def _command_of(overrides: Any) -> list[str]:
    return [o for o in overrides if not o.startswith("ckpt_path=")]


def checked_checkpoint(
    ckpt_path: str, output_dir: str, model: L.LightningModule, dataset: str | None, fitting: bool
) -> tuple[str, dict[str, Any] | None]:
    """The checkpoint `ckpt_path` names and its contents, checked to fit `model` and `dataset`;
    a folder of shards to fit from is the strategy's to read (one that reads files refuses it:
    `checkpoints.AtomicCheckpointIO`)."""
    if ckpt_path == "last":
        ckpt_path = str(last_checkpoint(Path(output_dir)))
    if fitting and checkpoints.is_whole(Path(ckpt_path)):  # its settings: in meta.pt
        try:
            meta = torch.load(Path(ckpt_path, "meta.pt"), map_location="cpu", weights_only=True)
        except Exception as err:  # torch.load raises many kinds on foreign bytes
            raise UserError(f"ckpt_path={ckpt_path}: its meta.pt does not read ({err}).") from err
        checkpoints.check_callback_paths(meta, f"ckpt_path={ckpt_path}")
        warn_of_ignored_settings(meta, model, ckpt_path)
        return ckpt_path, None
    checkpoint = checkpoints.read_checkpoint(ckpt_path)
    checkpoints.check_same_dataset(checkpoint, dataset, ckpt_path, model.hparams.get("class_names"))
    checkpoints.check_same_shapes(checkpoint["state_dict"], model.state_dict(), ckpt_path)
    if fitting:
        warn_of_ignored_settings(checkpoint, model, ckpt_path)
    return ckpt_path, checkpoint


def warn_of_ignored_settings(
    checkpoint: dict[str, Any], model: L.LightningModule, ckpt_path: str
) -> None:
    if ignored := settings_that_resuming_ignores(checkpoint, model.hparams):
        warning_on_rank_zero(
            f"Resuming {ckpt_path}: the optimizer and scheduler go on from their saved states, "
            f"so {', '.join(ignored)} {'has' if len(ignored) == 1 else 'have'} no effect. To "
            f"train with these settings, start a new run (without ckpt_path)."
        )


def settings_that_resuming_ignores(checkpoint: dict[str, Any], hparams: Any) -> list[str]:
    """`model.optimizer.*` and `model.scheduler.*` settings that differ from the checkpoint's:
    Lightning restores the optimizer's and scheduler's states, which hold them (a cosine
    schedule's `T_max`: resumed with more epochs, the saved cosine goes on, from 0 back up). A
    UserError for another optimizer or scheduler class, or one added or left out: the saved
    states fit only the classes that wrote them."""
    saved = checkpoint.get("hyper_parameters") or {}
    ignored = []
    for key in ("optimizer", "scheduler"):
        old, new = saved.get(key) or {}, hparams.get(key) or {}
        if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
            continue  # (a module of a fork's own, with other settings)
        if old.get("_target_") != new.get("_target_"):
            raise UserError(
                f"model.{key}._target_={new.get('_target_')}, but the checkpoint was trained with "
                f"{old.get('_target_')}: a resumed run goes on with the saved {key} state, which "
                f"fits only that. Resume with the {key} it was trained with, or start a new run."
            )
        for name in sorted(set(old) | set(new)):
            # Lightning's scheduler settings are read anew: not in the saved state.
            if name not in LIGHTNING_SCHEDULER_SETTINGS and old.get(name) != new.get(name):
                ignored.append(f"model.{key}.{name}={new.get(name)} (saved: {old.get(name)})")
    return ignored
