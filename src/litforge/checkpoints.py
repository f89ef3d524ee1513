"""Checkpoints: written whole (`AtomicCheckpointIO`, `LastCheckpoint`); read as data by `read`,
the one check every loading goes through (Lightning's too: `AtomicCheckpointIO.load_checkpoint`);
what a checkpoint may build (`trusted_class`: classes of this project's packages, of `torch.nn`
and `torch.optim`, and of `TRUSTED_PACKAGES`); the module it holds (`load_module`)."""

import functools
import importlib
import importlib.util
import inspect
import logging
import os
import random
import re
import sys
import types
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.core.saving import CHECKPOINT_PAST_HPARAMS_KEYS
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch.optim.lr_scheduler import ReduceLROnPlateau

from litforge.errors import UserError
from litforge.settings import PositiveInt

log = logging.getLogger(__name__)
warning_on_rank_zero = rank_zero_only(log.warning)
info_on_rank_zero = rank_zero_only(log.info)
FIX = "Point it at a checkpoint written by train.py (<run dir>/checkpoints/)."
MAX_CLASSES = 10_000  # of a checkpoint (`check_settings`)
# Third-party packages whose classes a checkpoint may build (a network config naming, say,
# `mylib.layers.Block`): add yours here. Beside them: this project's own packages (`src/<name>/`
# and `<name>/` of this checkout) and torch's building blocks.
TRUSTED_PACKAGES: tuple[str, ...] = ()
TORCH_PACKAGES = ("torch.nn", "torch.optim")  # (torch.optim.lr_scheduler is in torch.optim)
ROOT = Path(__file__).resolve().parents[2]  # the checkout, in src/<package>/checkpoints.py


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes beside the target, flushes, renames over it: a kill mid-write leaves the old one
    whole (Lightning's stages it in $TMPDIR, maybe another file system: a mere copy, Lightning
    #21253). Reads through `read`: what Lightning resumes or tests from is checked as data."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
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

    def load_checkpoint(self, path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        global _last_read
        checkpoint, _last_read = read(path), None  # (handed over: not kept any longer)
        return checkpoint


class LastCheckpoint(ModelCheckpoint):
    """`last.ckpt` every epoch, on SIGTERM, and every `every_n_train_steps` (against kill -9).
    Lightning's `save_last` (2.6) saves only when a best checkpoint is saved at the same step. A
    ModelCheckpoint that saves nothing itself (`save_top_k=0`): each save is `save(trainer)`,
    `trainer.save_checkpoint` on every process."""

    def __init__(self, dirpath: str, every_n_train_steps: PositiveInt | None = None) -> None:
        # Not ModelCheckpoint's own every_n_train_steps: it would turn the per-epoch save off.
        self.every_n_steps = every_n_train_steps
        super().__init__(
            dirpath=dirpath,
            filename="last",
            monitor=None,
            save_top_k=0,  # ModelCheckpoint's own saving off: `save` does it
            save_on_train_epoch_end=True,
            enable_version_counter=False,
        )
        self._last_step = -1
        self._epoch_saved_at_step: int | None = None
        self._saved_on_stop = False

    @property
    def path(self) -> Path:
        return Path(self.dirpath) / f"{self.filename}{self.FILE_EXTENSION}"

    def save(self, trainer: L.Trainer) -> None:
        """Write last.ckpt now (every process takes part: sharded strategies write together)."""
        self.best_model_path = str(self.path)  # before: the checkpoint holds this callback's state
        trainer.save_checkpoint(self.path, weights_only=False)  # the whole state, to resume
        if trainer.is_global_zero:
            log.info(
                f"Saved {self.path} (epoch {trainer.current_epoch}, step {trainer.global_step})"
            )
            for logger in trainer.loggers:
                logger.after_save_checkpoint(self)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After validation and the epoch's statistics (Lightning calls checkpoint callbacks last);
        # not in a fast_dev_run, nor twice at one step (an epoch that made no step).
        if not trainer.fast_dev_run and self._epoch_saved_at_step != trainer.global_step:
            self._epoch_saved_at_step = trainer.global_step
            self.save(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        step = trainer.global_step
        if (
            self.every_n_steps
            and step % self.every_n_steps == 0
            and step not in (0, self._last_step)  # accumulated batches repeat a step's number
            and batch_idx + 1 < trainer.num_training_batches  # else the epoch's save follows
        ):
            self._last_step = step
            self.save(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # Not when testing (the weights are then those of the best checkpoint), nor twice: a
        # callback that acts after the save may ask first.
        fitting = trainer.state.fn == TrainerFn.FITTING
        if isinstance(exception, SIGTERMException) and fitting and not self._saved_on_stop:
            self._saved_on_stop = True
            self.save(trainer)


@contextmanager
def stopped_by_sigterm(trainer: L.Trainer, what: str) -> Iterator[None]:
    """Exit with 143 (128 + SIGTERM, what schedulers expect), saying so, where Lightning's
    SIGTERMException exits with 0 (up to 2.6.6, Lightning #19916)."""
    try:
        yield
    except SIGTERMException:
        if trainer.is_global_zero:
            saved = [cb for cb in trainer.callbacks if isinstance(cb, LastCheckpoint)]
            where = f"saved to {saved[0].path}" if saved else "not saved"
            how = how_to_resume(trainer.default_root_dir)
            log.warning(
                f"Stopped while {what} at epoch {trainer.current_epoch}, step "
                f"{trainer.global_step}; checkpoint {where}: {how}."
            )
        sys.exit(143)


def how_to_resume(run: str | None = None) -> str:
    run_dir = override("hydra.run.dir", run) if run else "hydra.run.dir=<its run folder>"
    return f"to resume, run the same command with {run_dir} ckpt_path=last"


class ResumeState(L.Callback):
    """What Lightning leaves out of a checkpoint: the random generators' states (a resumed run
    draws the same dropout and augmentations), the module's class and the data's settings (what
    `eval.py` and other loaders rebuild it with). And resuming follows the run's config:
    the learning-rate schedule the module configures now (a longer run's stretches), and the
    best checkpoints so far when resumed into a new folder."""

    _states: dict[str, Any] | None = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        states = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states["cuda"] = torch.cuda.get_rng_state_all()
        checkpoint["rng_states"] = states
        checkpoint["module_class"] = class_path(type(pl_module))
        data = trainer.datamodule
        if all(hasattr(data, k) for k in ("input_shape", "class_names", "mean", "std")):
            checkpoint["data"] = {
                "input_shape": [int(n) for n in data.input_shape],
                "class_names": [str(name) for name in data.class_names],
                "mean": [float(m) for m in data.mean],
                "std": [float(s) for s in data.std],
            }

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        self._states = checkpoint.get("rng_states")
        # Lightning's ModelCheckpoint restores the scores of the best checkpoints only from its
        # own folder: resumed into a new one, its next epoch would be "the best" whatever its
        # score. Called before the callbacks load their states: they take them as their own. The
        # earlier best files stay where they are (ModelCheckpoint deletes only inside its
        # folder, by the path's words: `check_callback_paths` on reading and `keep_files_in`
        # here keep those words true).
        states = checkpoint.get("callbacks") or {}
        earlier = Path(trainer.ckpt_path).resolve().parent if trainer.ckpt_path else None
        for callback in trainer.checkpoint_callbacks:
            if not isinstance(callback, ModelCheckpoint) or not callback.dirpath:
                continue
            # Lightning takes a state by its key, or else by the class's name.
            for key in (callback.state_key, type(callback).__qualname__):
                if isinstance(state := states.get(key), dict):
                    folders = [Path(callback.dirpath).resolve(), earlier]
                    keep_files_in(state, folders, callback, trainer.ckpt_path)
                    state["dirpath"] = callback.dirpath

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Not when loading: after the sanity check, before the first batch, where the run stopped.
        if trainer.ckpt_path and trainer.lr_scheduler_configs:
            follow_configured_schedule(trainer, pl_module)
        if self._states is None:
            return
        torch.set_rng_state(self._states["torch"])
        random.setstate(self._states["python"])
        if "cuda" in self._states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(self._states["cuda"])
        self._states = None


def follow_configured_schedule(trainer: L.Trainer, pl_module: L.LightningModule) -> None:
    """Lightning restores a resumed run's schedulers with their saved settings: a cosine over
    the old `trainer.max_epochs` stays at its end, learning rate 0, for every added epoch. When
    the module now configures other settings, its new schedule is replayed to the resumed step
    and replaces the saved one, learning rates included (the optimizers' other states stay)."""
    fresh = pl_module.configure_optimizers()
    if isinstance(fresh, Mapping):  # (the forms of `configure_optimizers` with one scheduler)
        fresh = fresh.get("lr_scheduler")
    fresh = fresh.get("scheduler") if isinstance(fresh, Mapping) else fresh
    restored = trainer.lr_scheduler_configs[0].scheduler
    if len(trainer.lr_scheduler_configs) > 1 or type(fresh) is not type(restored):
        return  # (several schedulers, or other forms: their saved states go on as they are)
    if isinstance(fresh, ReduceLROnPlateau) or _settings(fresh) == _settings(restored):
        return
    with warnings.catch_warnings():  # (stepped without an optimizer step: said by torch)
        warnings.simplefilter("ignore")
        for _ in range(restored.last_epoch):
            fresh.step()
    restored.load_state_dict(fresh.state_dict())
    for group, replayed in zip(
        restored.optimizer.param_groups, fresh.optimizer.param_groups, strict=True
    ):
        group["lr"] = replayed["lr"]
        group["initial_lr"] = replayed.get("initial_lr", replayed["lr"])
    info_on_rank_zero(
        f"Resuming with other scheduler settings than the checkpoint's "
        f"({', '.join(f'{k}={v}' for k, v in _settings(fresh).items())}): the new schedule goes on "
        f"from step {restored.last_epoch}, learning rate {restored.get_last_lr()[0]:.3g}."
    )


def _settings(scheduler: Any) -> dict[str, Any]:
    """A scheduler's own settings: its state but how far it has gone."""
    progress = {"last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "verbose"}
    progress |= {"_is_initial", "base_lrs", "optimizer"}
    return {k: v for k, v in scheduler.state_dict().items() if k not in progress}


def keep_files_in(
    state: dict[str, Any], folders: list[Path | None], callback: ModelCheckpoint, ckpt_path: Any
) -> None:
    """A ModelCheckpoint's saved state keeps the checkpoints it names only when each lies, links
    followed, in `folders` (its own, and the one of the checkpoint resumed): it deletes the
    k-th best once a better one is saved. Otherwise it is forgotten, and said."""
    outside = [
        path
        for path in named_files(state)
        if not any(f and f in Path(str(path)).resolve().parents for f in folders)
    ]
    if outside:
        warning_on_rank_zero(
            f"Resuming {ckpt_path}: its checkpoint callback's state names "
            f"{str(outside[0])[:200]!r}, outside this run's checkpoints and the resumed one's "
            f"folder: forgotten, the best checkpoint is chosen among this run's epochs."
        )
        state.update(
            best_model_path="",
            best_model_score=None,
            best_k_models={},
            kth_best_model_path="",
            kth_value=callback.kth_value,
            last_model_path="",
        )


def read(path: str | Path) -> dict[str, Any]:
    """The checkpoint file `path`, checked as data, or a UserError saying why not: a file
    torch.save wrote (read with `weights_only=True`: no pickled code runs), a Lightning
    checkpoint of 2.0 or later, whose callback states name only files as Lightning writes them
    and whose image settings are of the right kinds and sizes. (What its settings build is
    checked where they are built: `check_sizes`.) Read once per command: the last file read is
    kept, for Lightning's loading that follows (`AtomicCheckpointIO`)."""
    global _last_read
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(_not_a_file(path))
    stat = path.stat()
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if _last_read is not None and _last_read[0] == key:
        return _last_read[1]
    with path.open("rb") as f:
        if f.read(4) != b"PK\x03\x04":  # what torch.save writes
            raise UserError(
                f"ckpt_path={path} is not a checkpoint (not a file torch.save wrote). {FIX}"
            )
    try:  # mmap: tensors are read when used, so checking a large checkpoint costs little
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch.load raises many kinds on foreign bytes
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"ckpt_path={path} is not a readable checkpoint ({first_line[:200]}). {FIX}"
        ) from err
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise UserError(
            f"ckpt_path={path} is a torch file but not a Lightning checkpoint (no 'state_dict'). "
            + FIX
        )
    where = f"ckpt_path={path}"
    check_version(checkpoint, where)
    check_callback_paths(checkpoint, where)
    check_data(checkpoint, where)
    _last_read = (key, checkpoint)
    return checkpoint


_last_read: tuple[tuple, dict[str, Any]] | None = None


def _not_a_file(path: Path) -> str:
    if not path.exists():
        near = sorted(p.name for p in path.parent.glob("*.ckpt")) if path.parent.is_dir() else []
        there = f" {path.parent} holds: {', '.join(near[:4])}." if near else ""
        return f"ckpt_path={path}: no such file.{there}"
    if (path / ".metadata").is_file():  # feature: model_parallel
        return (
            f"ckpt_path={path} is a folder of shards: the strategy that wrote it reads it "
            f"(strategy=<that one> train=false tests it)."
        )
    # A run's checkpoints/, or Lightning's own under a logger's folder (callbacks=none).
    folders = [path / "checkpoints", *path.glob("*/checkpoints"), path]
    folder = next((f for f in folders if any(f.glob("*.ckpt"))), path)
    found = sorted(p.name for p in folder.glob("*.ckpt"))
    if not found:
        return (
            f"ckpt_path={path} is a folder, but neither a checkpoint nor a run folder with "
            f"checkpoints. {FIX}"
        )
    best = [name for name in found if name != "last.ckpt"]
    choices = [f"{override('ckpt_path', folder / 'last.ckpt')} (the latest)"]
    choices = choices if "last.ckpt" in found else []
    choices += [f"{override('ckpt_path', folder / best[-1])} (the best)"] if best else []
    return f"ckpt_path={path} is a folder of checkpoints: give one, e.g. {' or '.join(choices)}"


def checkpoint_file(ckpt_path: str, checkpoint_dirs: Sequence[str | Path]) -> str | None:
    """The file `ckpt_path` means: `last`, as in Lightning, the newest `last*.ckpt` in this
    run's checkpoint folders (None, said, when there is none yet: the run starts fresh); a run
    folder, its `checkpoints/last.ckpt`; else the path as given."""
    if ckpt_path == "last":
        found = [p for d in checkpoint_dirs for p in Path(d).glob("last*.ckpt")]
        if not found:
            info_on_rank_zero(
                f"No checkpoint in {', '.join(map(str, checkpoint_dirs))} to resume "
                f"(ckpt_path=last): starting fresh. An earlier run's folder: give "
                f"hydra.run.dir=<it> (where it goes on), or ckpt_path=<it>."
            )
            return None
        return str(max(found, key=os.path.getmtime))
    run_last = Path(ckpt_path).expanduser() / "checkpoints" / "last.ckpt"
    return str(run_last) if run_last.exists() else ckpt_path


def check_version(checkpoint: Mapping[str, Any], where: str) -> None:
    """Written by Lightning 2.0 or later: Lightning migrates only older checkpoints on loading
    (moving settings and file paths from keys of their own), so what `read` checks is what
    Lightning reads (tests/test_resume.py holds Lightning's migrations to that)."""
    from packaging.version import InvalidVersion, Version

    written_by = checkpoint.get("pytorch-lightning_version")
    try:
        old = Version(str(written_by)) < Version("2.0")
    except InvalidVersion:
        raise UserError(f"{where} names no Lightning version that wrote it. {FIX}") from None
    if old:
        raise UserError(f"{where} was written by Lightning {written_by}, before 2.0. {FIX}")


def override(key: str, path: str | Path) -> str:
    """`key=path` as a shell passes it to Hydra: a value with `=` in it quoted for Hydra
    (`"key='a=1'"`), since Hydra reads `=` as the start of another override."""
    return f"\"{key}='{path}'\"" if "=" in str(path) else f"{key}={path}"


def check_data(checkpoint: Mapping[str, Any], where: str) -> None:
    """The data's settings in a checkpoint (what eval.py and other loaders use) are plain
    values of the right kinds and sizes."""
    from litforge.data.images import INTERPOLATIONS

    data = checkpoint.get("datamodule_hyper_parameters") or {}
    if not isinstance(data, Mapping) or not isinstance(data.get("name", ""), str):
        raise UserError(f"{where} holds data settings that are no dict of values. {FIX}")
    if data.get("interpolation") not in (None, *INTERPOLATIONS):
        shown = repr(data["interpolation"])[:80]
        raise UserError(f"{where}: data.interpolation={shown} is none of {INTERPOLATIONS}.")
    try:
        check_settings(**data_settings(checkpoint))
    except UserError as err:
        raise UserError(f"{where}: {err}") from None


def check_buildable(checkpoint: Mapping[str, Any], where: str) -> None:
    """What a checkpoint's settings would build (the module's constructor gets them) is trusted
    (`check_targets`), checked before anything is built. The keys of Lightning before 1.0 that
    its loading still merges in (`CHECKPOINT_PAST_HPARAMS_KEYS`) are refused: train.py never
    writes them, and a caller's `hparams_file` would replace `hyper_parameters` but not them."""
    if legacy := [key for key in CHECKPOINT_PAST_HPARAMS_KEYS if checkpoint.get(key)]:
        raise UserError(
            f"{where} holds settings under {', '.join(legacy)}, keys of Lightning before 1.0 "
            f"that train.py never writes. {FIX}"
        )
    settings = checkpoint.get("hyper_parameters") or {}
    if not isinstance(settings, Mapping):
        raise UserError(f"{where} holds hyper-parameters that are no dict of settings. {FIX}")
    if not isinstance(checkpoint.get("hparams_type") or "", str):  # Lightning would call it
        raise UserError(f"{where}: its hparams_type {checkpoint['hparams_type']!r} is no name.")
    check_targets(settings, where, "model")


def check_targets(value: Any, where: str, key: str) -> None:
    """Every config in `value` (a dict with a `_target_`, at any depth) builds a trusted class
    from plain values: no `${...}` (`oc.decode` could build anything), no Hydra keyword but
    `_partial_`, no weights to fetch or read (`pretrained*`: a checkpoint holds its weights)."""
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise UserError(f"{where}: {key} has keys that are no names: {list(value)[:8]}.")
        if "_target_" in value:
            trusted_class(value["_target_"], f"{where}: {key}")
            keywords = {k for k in value if k.startswith("_") and k.endswith("_")}
            if extra := keywords - {"_target_", "_partial_"}:
                raise UserError(
                    f"{where}: {key} has {', '.join(sorted(extra))}: a checkpoint's configs are "
                    f"built from a _target_ and plain values (and _partial_) only. {FIX}"
                )
            if pretrained := [k for k in value if k.startswith("pretrained")]:
                raise UserError(
                    f"{where}: {key} has {', '.join(pretrained)}: a checkpoint holds its "
                    f"weights, and names no weights to fetch or read."
                )
        for name, item in value.items():
            check_targets(item, where, f"{key}.{name}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_targets(item, where, f"{key}[{i}]")
    elif isinstance(value, str) and "${" in value:
        raise UserError(f"{where}: {key}={value[:200]} is an interpolation, no plain value.")


TRUSTED = (
    "A checkpoint builds only classes defined in this project's packages, torch.nn, torch.optim "
    "and litforge.checkpoints.TRUSTED_PACKAGES (docs/evaluation.md)."
)
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def trusted_class(target: Any, where: str) -> type:
    """The class `target` names (`module.Class`, as a config's `_target_`), when it is defined
    in a trusted package: this project's own (`project_packages`), `torch.nn`, `torch.optim` or
    `TRUSTED_PACKAGES`. Exactly: the class's own module and qualified name, reached without
    passing through another module (`litforge.models.torch.load` is torch's), and a class, no
    function. Only modules in those packages are imported on the way: a checkpoint's names
    never choose what code runs."""
    shown = f"{where}._target_={str(target)[:200]!r}"
    if not isinstance(target, str) or not DOTTED.fullmatch(target):
        raise UserError(f"{shown} is not allowed (no module.Class name). {TRUSTED}")
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest module first
        module_name, names = ".".join(parts[:cut]), parts[cut:]
        if not _trusted_module(module_name):
            raise UserError(f"{shown} is not allowed. {TRUSTED}")
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and module_name.startswith(err.name):
                continue  # no such module: a shorter name is one, with a class in it
            raise UserError(f"{shown}: importing {module_name} failed ({err}).") from None
        for name in names:
            obj = getattr(obj, name, None)
            if isinstance(obj, types.ModuleType):
                raise UserError(
                    f"{shown} is not allowed (a name through another module). {TRUSTED}"
                )
        if not isinstance(obj, type):
            raise UserError(
                f"{shown} is not allowed ({'no class' if obj else 'not found'}). {TRUSTED}"
            )
        if obj.__qualname__ != ".".join(names) or not _trusted_module(obj.__module__):
            raise UserError(f"{shown} is not allowed (a class defined elsewhere). {TRUSTED}")
        return obj
    raise UserError(f"{shown} is not allowed. {TRUSTED}")


def _trusted_module(name: str) -> bool:
    within = (*TORCH_PACKAGES, *TRUSTED_PACKAGES)
    inside = any(name == p or name.startswith(f"{p}.") for p in within)
    return inside or name.split(".")[0] in project_packages()


@functools.cache
def project_packages() -> frozenset[str]:
    """This package, and the packages of this checkout: the folders with an `__init__.py` in
    `src/` and at its root (but `tests/`), when Python finds them there. Found on disk: nothing
    is imported."""
    found = {__name__.split(".")[0]}
    if not (ROOT / "pyproject.toml").is_file():  # (installed, not a checkout: this one only)
        return frozenset(found)
    for folder in (ROOT / "src", ROOT):
        for init in folder.glob("*/__init__.py"):
            name = init.parent.name
            spec = importlib.util.find_spec(name) if name.isidentifier() else None
            if (
                name != "tests"
                and spec
                and spec.origin
                and Path(spec.origin).resolve() == init.resolve()
            ):
                found.add(name)
    return frozenset(found)


def check_callback_paths(checkpoint: Mapping[str, Any], where: str) -> None:
    """The files the callbacks' saved states name (ModelCheckpoint's best and k-th best, which it
    deletes once better ones are saved) are named as Lightning writes them: absolute, normalized
    local paths. ModelCheckpoint deletes only files inside its own folder, but compares the
    words of the path, so `<its folder>/../x` would pass: a UserError instead."""
    states = checkpoint.get("callbacks") or {}
    if not isinstance(states, Mapping):
        raise UserError(f"{where} holds callback states that are no dict. {FIX}")
    for name, state in states.items():
        if not isinstance(state, Mapping):
            continue
        for path in (p for p in named_files(state) if not _normal_path(p)):
            raise UserError(
                f"{where}: the saved state of its callback {str(name)[:80]!r} names the file "
                f"{str(path)[:200]!r}, which is no absolute path without '..' or '.' parts: a "
                f"checkpoint names no file to touch outside its run. {FIX}"
            )


def named_files(state: Mapping[str, Any]) -> list[Any]:
    """The files a callback's saved state names: its `*_path` values (its folder, `dirpath`,
    aside) and the keys of ModelCheckpoint's `best_k_models`; empty ones left out."""
    named = [v for k, v in state.items() if str(k).endswith("path") and k != "dirpath"]
    named += list(state.get("best_k_models") or {})
    return [path for path in named if path not in (None, "")]


def _normal_path(path: Any) -> bool:
    """An absolute local path without `.` or `..` parts (as Lightning's callbacks save them)."""
    return isinstance(path, str) and os.path.isabs(path) and os.path.normpath(path) == path


def check_settings(
    input_shape: Any = None,
    num_classes: Any = None,
    class_names: Any = None,
    class_weights: Any = None,
    mean: Any = None,
    std: Any = None,
) -> None:
    """The image settings a checkpoint gives are of the right kinds and sizes, where it gives
    them (data, never configs to build): a UserError naming the first that is not."""

    def listed(value: Any, kind: type | tuple[type, ...]) -> bool:
        return (
            isinstance(value, Sequence)
            and not isinstance(value, str)
            and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
        )

    from litforge.data.images import MAX_IMAGE_SIZE

    if input_shape is not None:
        if not (listed(input_shape, int) and len(input_shape) == 3 and min(input_shape) > 0):
            raise UserError(
                f"input_shape={input_shape!r} is no (channels, height, width) of pixels."
            )
        if max(input_shape[1:]) > MAX_IMAGE_SIZE or input_shape[0] > 4:
            raise UserError(
                f"input_shape={input_shape!r} is out of range: images of 1 to 4 channels and at "
                f"most {MAX_IMAGE_SIZE} px a side."
            )
    classes = num_classes if num_classes is not None else class_names and len(class_names)
    if classes is not None and (
        isinstance(classes, bool) or not isinstance(classes, int) or classes < 2
    ):
        raise UserError(f"num_classes={num_classes!r} is no number of classes (2 or more).")
    if classes is not None and classes > MAX_CLASSES:
        raise UserError(
            f"num_classes={classes} is out of range: at most {MAX_CLASSES:,} (the test "
            f"confusion matrix holds num_classes² counts: {MAX_CLASSES:,} classes take 800 MB)."
        )
    if class_names is not None and not listed(class_names, str):
        raise UserError(f"class_names={class_names!r} is no list of names.")
    for name, value in (("class_weights", class_weights), ("mean", mean), ("std", std)):
        if value is not None and not listed(value, (int, float)):
            raise UserError(f"{name}={value!r} is no list of numbers.")


def data_settings(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """What the checkpoint says of its images: input shape, class names, normalization (a module's
    own settings, or what `ResumeState` saved of the data)."""
    data = checkpoint.get("data") if isinstance(checkpoint.get("data"), Mapping) else {}
    hp = checkpoint.get("hyper_parameters") or {}
    names = ("input_shape", "num_classes", "class_names", "class_weights", "mean", "std")
    return {k: hp[k] if hp.get(k) is not None else data.get(k) for k in names}


def module_arguments(checkpoint: Mapping[str, Any], module_class: type) -> dict[str, Any]:
    """What Lightning's `load_from_checkpoint` passes from `checkpoint` to `module_class`'s
    constructor, gathered as Lightning gathers it (`lightning.pytorch.core.saving._load_state`;
    tests/test_eval.py holds the two the same): `hyper_parameters`, all as one argument when
    `hparams_name` names a parameter (the older keys it merges in: refused on reading)."""
    settings = dict(checkpoint.get("hyper_parameters") or {})
    name = checkpoint.get("hparams_name")
    parameters = list(inspect.signature(module_class.__init__).parameters)[1:]
    return {name: settings} if isinstance(name, str) and name in parameters else settings


def module_class(checkpoint: Mapping[str, Any], where: str, target: str | None = None) -> type:
    """The LightningModule class: `target` (a trusted config's `model._target_`), else the one
    the checkpoint names (`ResumeState` saves it) when `trusted_class` allows it, else ours."""
    from hydra.utils import get_class

    if target or not checkpoint.get("module_class"):  # (a run without ResumeState: ours)
        return get_class(target or "litforge.models.ClassificationModule")
    found = trusted_class(checkpoint["module_class"], f"{where}: module_class")
    if not issubclass(found, L.LightningModule):
        raise UserError(f"{where}: module_class={class_path(found)} is no LightningModule.")
    return found


def build_module(checkpoint: dict[str, Any], cls: type, where: str) -> L.LightningModule:
    """`cls` with the checkpoint's settings (its weights not loaded): `check_sizes` first."""
    check_sizes(checkpoint, cls, where)
    return cls(**module_arguments(checkpoint, cls))


def check_sizes(checkpoint: dict[str, Any], cls: type, where: str) -> None:
    """Its settings build only trusted classes (`check_buildable`), and, built on the meta
    device first (no memory), the module has the shapes of the checkpoint's tensors: settings
    naming a larger network than they hold are refused before anything is allocated."""
    check_buildable(checkpoint, where)
    arguments = module_arguments(checkpoint, cls)
    try:
        with torch.device("meta"):
            model = cls(**arguments)
    except UserError as err:
        raise UserError(f"{where}: {err}") from None
    except Exception as err:  # settings that build nothing: any kind a constructor raises
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"{where}: its settings build no module ({first_line[:200]}).") from err
    fix = "Its settings do not fit its weights: it was not written by train.py."
    check_same_shapes(checkpoint["state_dict"], model.state_dict(), where, fix)


def load_module(path: str | Path, target: str | None = None) -> L.LightningModule:
    """The module a checkpoint file holds, for other programs (predict, export, serve): checked
    by `read`, built by `build_module`, its weights loaded by Lightning's `load_from_checkpoint`."""
    checkpoint = read(path)
    cls = module_class(checkpoint, f"ckpt_path={path}", target)
    check_sizes(checkpoint, cls, f"ckpt_path={path}")
    return cls.load_from_checkpoint(path, map_location="cpu", weights_only=True)


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def check_same_dataset(
    checkpoint: dict[str, Any],
    dataset: str | None,
    ckpt_path: str,
    class_names: Sequence[str] | None = None,
) -> None:
    """Same dataset and classes (one `data=image_folder` may have other classes than another)."""
    trained_on = (checkpoint.get("datamodule_hyper_parameters") or {}).get("name")
    if trained_on and dataset and trained_on != dataset:
        raise UserError(
            f"{ckpt_path} was trained on '{trained_on}', the config selects "
            f"'{dataset}'. Add data={trained_on}."
        )
    trained_classes = data_settings(checkpoint)["class_names"]
    if trained_classes and class_names and list(trained_classes) != list(class_names):
        shown = ", ".join(trained_classes[:6]) + (", ..." if len(trained_classes) > 6 else "")
        raise UserError(
            f"{ckpt_path} was trained on other classes ({shown}) than the data has "
            f"({', '.join(list(class_names)[:6])}{', ...' if len(class_names) > 6 else ''}): "
            f"use data with the classes it was trained on."
        )


def check_same_shapes(
    saved: dict[str, Any],
    current: dict[str, Any],
    ckpt_path: str,
    fix: str = "Use the model config it was trained with (its run dir's .hydra/config.yaml).",
) -> None:
    if not isinstance(saved, Mapping):
        raise UserError(f"{ckpt_path} holds a state_dict that is no dict of tensors. {FIX}")
    differences = [
        f"{k}: checkpoint {list(getattr(saved[k], 'shape', []))}, model {list(v.shape)}"
        for k, v in current.items()
        if k in saved
        and hasattr(v, "shape")
        and tuple(getattr(saved[k], "shape", ())) != tuple(v.shape)
    ]
    differences += [  # (a tensor expanded from one value has the shape, not the bytes)
        f"{k}: {list(v.shape)} held in {v.untyped_storage().nbytes()} bytes"
        for k, v in saved.items()
        if isinstance(v, torch.Tensor) and v.untyped_storage().nbytes() < v.nbytes
    ]
    differences += [f"missing {k}" for k in current if k not in saved]
    differences += [f"unexpected {k}" for k in saved if k not in current]
    if differences:
        shown = "; ".join(differences[:4]) + (" ..." if len(differences) > 4 else "")
        raise UserError(
            f"{ckpt_path} holds another architecture than the configured model "
            f"({len(differences)} difference(s): {shown}). {fix}"
        )
