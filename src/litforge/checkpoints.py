"""Checkpoints: writing; reading (a checkpoint is data: `check_registered` lets it build only what
`litforge.models` registers); checking one fits the configured data and model. Which one a run
continues from: `resume`."""

import contextlib
import copy
import functools
import inspect
import logging
import os
import random
import tempfile
import warnings
from collections.abc import Mapping, Sequence
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

from litforge.errors import UserError, check_number

log = logging.getLogger(__name__)
warning_on_rank_zero = rank_zero_only(log.warning)
FIX = "Point it at a checkpoint written by train.py (<run dir>/checkpoints/)."
MAX_CLASSES = 10_000  # of a checkpoint (`check_settings`)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write beside the target, flush, rename over it: a kill mid-write leaves the old one whole.
    (Lightning's stages it in $TMPDIR, maybe another file system: a mere copy, Lightning #21253)"""

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
        if Path(path).is_dir():  # the strategies that write folders of shards read them too
            raise UserError(
                f"{path} is a folder of shards: training resumes from it with the strategy and "
                f"sizes that wrote it (to test it: train=false)."
            )
        return super().load_checkpoint(path, *args, **kwargs)


class LastCheckpoint(ModelCheckpoint):
    """`last.ckpt` every epoch, on SIGTERM, and every `every_n_train_steps` (against kill -9).
    Lightning's `save_last` saves only with a monitored checkpoint (Lightning #20245). A
    ModelCheckpoint that saves nothing itself (`save_top_k=0`): each save is `save(trainer)`,
    `trainer.save_checkpoint` on every process."""

    def __init__(self, dirpath: str, every_n_train_steps: int | None = None) -> None:
        if every_n_train_steps is not None:
            check_number("every_n_train_steps", every_n_train_steps, integer=True, minimum=1)
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


class ResumeState(L.Callback):
    """Saves what Lightning leaves out: the random generators' states (a resumed run draws the
    same dropout and augmentations). And a run resumed into a new folder goes on from the best
    checkpoints so far, as one that was never stopped would."""

    _states: dict[str, Any] | None = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        states = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states["cuda"] = torch.cuda.get_rng_state_all()
        checkpoint["rng_states"] = states

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        self._states = checkpoint.get("rng_states")
        # Lightning's ModelCheckpoint restores the scores of the best checkpoints only from its
        # own folder: resumed into a new one, its next epoch would be "the best" whatever its
        # score, and a run that did not improve would test other weights than an uninterrupted
        # one. Called before the callbacks load their states: they take them as their own. The
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
        if self._states is None:
            return
        torch.set_rng_state(self._states["torch"])
        random.setstate(self._states["python"])
        if "cuda" in self._states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(self._states["cuda"])
        self._states = None


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


def is_whole(folder: Path) -> bool:
    """Shards are whole once Lightning wrote meta.pt after .metadata (rewritten in place)."""
    return (folder / ".metadata").is_file() and (folder / "meta.pt").is_file()


def _read_shards(folder: Path) -> dict[str, Any]:
    """A folder of shards (torch.distributed.checkpoint, with Lightning's meta.pt) as one dict,
    through torch's public converter to a single file (written to a temporary folder)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="litforge-shards-") as temporary:
        whole = Path(temporary) / "checkpoint.pt"
        dcp_to_torch_save(folder, whole)
        checkpoint = torch.load(whole, map_location="cpu", weights_only=True)
    checkpoint.update(torch.load(folder / "meta.pt", map_location="cpu", weights_only=True))
    return checkpoint


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint in `path` (a file, or a folder of shards), or a UserError saying why not."""
    path = Path(path).expanduser()
    if not path.exists():
        near = sorted(p.name for p in path.parent.glob("*.ckpt")) if path.parent.is_dir() else []
        there = f" {path.parent} holds: {', '.join(near[:4])}." if near else ""
        raise UserError(f"ckpt_path={path}: no such file.{there}")
    if path.is_dir() and not is_whole(path):  # a folder of shards cut off, or of checkpoints
        # A run's checkpoints/, or Lightning's own checkpoint folder under a logger's folder
        # (callbacks=none); several: a folder of runs.
        own = path / "checkpoints"
        folders = [own, *path.glob("*/checkpoints"), *path.glob("*/*/checkpoints")]
        folders = [f for f in folders if any(f.glob("*.ckpt"))]
        if len(folders) > 1 and folders[0] != own:
            newest = max((f for d in folders for f in d.glob("*.ckpt")), key=os.path.getmtime)
            raise UserError(
                f"ckpt_path={path} holds the checkpoints of several runs: give one, e.g. the "
                f"newest, {override('ckpt_path', newest)}"
            )
        folder = folders[0] if folders else path
        found = sorted(p.name for p in folder.glob("*.ckpt"))
        if not found:
            raise UserError(
                f"ckpt_path={path} is a folder, but neither a checkpoint nor a run folder with "
                f"checkpoints. {FIX}"
            )
        best = [name for name in found if name != "last.ckpt"]
        choices = [f"{override('ckpt_path', folder / 'last.ckpt')} (the latest)"]
        choices = choices if "last.ckpt" in found else []
        choices += [f"{override('ckpt_path', folder / best[-1])} (the best)"] if best else []
        raise UserError(
            f"ckpt_path={path} is a folder of checkpoints: give one, e.g. {' or '.join(choices)}"
        )
    if path.is_file():
        with path.open("rb") as f:
            if f.read(4) != b"PK\x03\x04":  # what torch.save writes
                raise UserError(
                    f"ckpt_path={path} is not a checkpoint (not a file torch.save wrote). {FIX}"
                )
    try:
        if path.is_dir():
            checkpoint = _read_shards(path)
        else:  # mmap: tensors are read when used, so checking a large checkpoint costs little
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
    migrated = as_lightning_reads_it(checkpoint, f"ckpt_path={path}")
    check_registered(migrated, f"ckpt_path={path}")
    check_callback_paths(migrated, f"ckpt_path={path}")
    return checkpoint


def as_lightning_reads_it(checkpoint: dict[str, Any], where: str) -> dict[str, Any]:
    """The checkpoint but its tensors of weights, as Lightning reads it: its migrations of older
    formats (`migrate_checkpoint`) move settings and callback states into today's keys. (Run on
    a copy: they change what they are given.)"""
    from lightning.pytorch.utilities.migration import migrate_checkpoint
    from packaging.version import InvalidVersion, Version

    written_by = checkpoint.get("pytorch-lightning_version")
    try:
        old = Version(str(written_by)) < Version("2.0")
    except InvalidVersion:
        raise UserError(f"{where} names no Lightning version that wrote it. {FIX}") from None
    if old:  # (its migrations move settings and file paths from keys of their own)
        raise UserError(f"{where} was written by Lightning {written_by}, before 2.0. {FIX}")
    weights = ("state_dict", "optimizer_states")
    copied = copy.deepcopy({k: v for k, v in checkpoint.items() if k not in weights})
    try:
        with warnings.catch_warnings():  # (one of a newer Lightning: said again on loading)
            warnings.simplefilter("ignore")
            return migrate_checkpoint(copied)[0]
    except Exception as err:  # a migration meeting keys of another shape
        raise UserError(
            f"{where} is of a format Lightning does not read ({err!r}). {FIX}"
        ) from None


def override(key: str, path: str | Path) -> str:
    """`key=path` as a shell passes it to Hydra: a value with `=` in it quoted for Hydra
    (`"key='a=1'"`), since Hydra reads `=` as the start of another override."""
    return f"\"{key}='{path}'\"" if "=" in str(path) else f"{key}={path}"


def check_registered(
    checkpoint: dict[str, Any], where: str, module_class: type | None = None
) -> None:
    """A UserError unless what the checkpoint's settings would build is registered in
    `litforge.models` (matched exactly) and its other settings are plain values of the right
    kinds: checked on reading, before anything is built or any module imported. The settings
    checked are those Lightning would pass to `module_class`'s constructor (each class of
    `MODULES` when None): `module_arguments`."""
    from litforge.data.images import INTERPOLATIONS
    from litforge.models import MODULES

    data = checkpoint.get("datamodule_hyper_parameters") or {}
    if not isinstance(data, dict):
        raise UserError(f"{where} holds hyper-parameters that are no dict of settings. {FIX}")
    for cls in [module_class] if module_class else MODULES:
        try:
            check_module_arguments(module_arguments(checkpoint, cls), cls)
        except UserError as err:
            raise UserError(f"{where}: {err}") from None
    if data.get("interpolation") not in (None, *INTERPOLATIONS):
        raise UserError(
            f"{where}: data.interpolation={data['interpolation']!r} is none of {INTERPOLATIONS}."
        )
    if not isinstance(data.get("name", ""), str):
        raise UserError(f"{where}: its dataset name {data['name']!r} is no name. {FIX}")


def module_arguments(checkpoint: Mapping[str, Any], module_class: type) -> dict[str, Any]:
    """What Lightning's `load_from_checkpoint` passes from `checkpoint` to `module_class`'s
    constructor, gathered as Lightning gathers it (`lightning.pytorch.core.saving._load_state`;
    tests/test_eval.py holds the two the same): `hyper_parameters`, all as one argument when
    `hparams_name` names a parameter. Settings the constructor does not take are kept: the check
    refuses them. The older keys Lightning still merges in (`CHECKPOINT_PAST_HPARAMS_KEYS`) are
    refused: no checkpoint of today holds them, and a caller's `hparams_file` would replace
    `hyper_parameters` but not them."""
    if legacy := [key for key in CHECKPOINT_PAST_HPARAMS_KEYS if checkpoint.get(key)]:
        raise UserError(
            f"it holds settings under {', '.join(legacy)}, keys of Lightning before 1.0 that "
            f"train.py never writes. {FIX}"
        )
    settings = checkpoint.get("hyper_parameters") or {}
    if not isinstance(settings, Mapping):
        raise UserError(f"its hyper_parameters are no dict of settings. {FIX}")
    if not isinstance(checkpoint.get("hparams_type") or "", str):  # Lightning would call it
        raise UserError(f"its hparams_type {checkpoint['hparams_type']!r} is no type name. {FIX}")
    name = checkpoint.get("hparams_name")
    if isinstance(name, str) and name in parameters(module_class)[0]:
        return {name: dict(settings)}
    return dict(settings)


def parameters(module_class: type) -> tuple[list[str], bool]:
    """The names of the constructor's parameters, and whether it takes any other (`**kwargs`)."""
    signature = list(inspect.signature(module_class.__init__).parameters.values())[1:]
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    any_other = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in signature)
    return [p.name for p in signature if p.kind in named], any_other


def check_module_arguments(hp: dict[str, Any], module_class: type) -> None:
    """The settings a checkpoint gives `module_class`: only those it takes; the configs it
    builds registered; the plain values of the right kinds."""
    from litforge.models import NETWORKS, OPTIMIZERS, SCHEDULERS

    accepted, any_other = parameters(module_class)
    if not any_other and (unknown := [k for k in hp if k not in accepted]):
        raise UserError(
            f"it holds settings {class_path(module_class)} does not take: {unknown}. A "
            f"LightningModule of yours that takes them: add it to MODULES in "
            f"src/litforge/models/__init__.py."
        )
    if "input_shape" in hp:  # what eval.py also fills data settings with
        settings = ("num_classes", "class_names", "class_weights", "mean", "std")
        check_settings(hp["input_shape"], *(hp.get(k) for k in settings))
    for key, kind in (("compile", bool), ("channels_last", bool)):
        if key in hp and not isinstance(hp[key], kind):
            raise UserError(f"{key}={hp[key]!r} is no {kind.__name__}.")
    for key in ("label_smoothing", "backbone_lr_scale"):
        if key in hp and (isinstance(hp[key], bool) or not isinstance(hp[key], (int, float))):
            raise UserError(f"{key}={hp[key]!r} is no number.")
    if hp.get("net") is not None:
        net = check_buildable(hp["net"], "model.net", NETWORKS)
        if pretrained := [k for k in net if k.startswith("pretrained")]:
            raise UserError(
                f"model.net has {', '.join(pretrained)}: a checkpoint holds its weights, "
                f"and names no weights to fetch or read."
            )
    if hp.get("optimizer") is not None:
        check_buildable(hp["optimizer"], "model.optimizer", OPTIMIZERS, partial=True)
    if hp.get("scheduler") is not None:
        check_buildable(hp["scheduler"], "model.scheduler", SCHEDULERS, partial=True)


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


def registered_name(target: object, allowed: Sequence[str]) -> str | None:
    """The entry of `allowed` that `target` names, or None: the entry itself, or the path where
    its class is defined. Nothing is imported by `target`'s own name: a checkpoint's names never
    choose what code runs, not even which modules load."""
    if not isinstance(target, str):
        return None
    return target if target in allowed else _defined_at(tuple(allowed)).get(target)


@functools.cache
def _defined_at(allowed: tuple[str, ...]) -> dict[str, str]:
    """`module.qualname` of each listed class → its listed name (only listed names import)."""
    from hydra.utils import get_object

    found = {}
    for name in allowed:
        with contextlib.suppress(Exception):  # a listed network whose extra is not installed
            obj = get_object(name)
            found[f"{obj.__module__}.{obj.__qualname__}"] = name
    return found


def check_buildable(config: Any, key: str, allowed: Sequence[str], partial: bool = False) -> Any:
    """A checkpoint's `config`, its `_target_` replaced by the registered name; a UserError
    unless it builds one of `allowed` from plain values: no `${...}` (`oc.decode` could build
    anything), no Hydra keyword but `_partial_: true` (`partial`: an optimizer or scheduler,
    given its parameters later), and a `_target_` inside it only where that too is `allowed`
    (a network config holding a backbone's)."""
    if config is None:
        return None
    if not isinstance(config, Mapping):
        plain = isinstance(config, (str, int, float, bool, list, tuple))
        what = f"the value {str(config)[:60]!r}" if plain else f"a {type(config).__name__} object"
        raise UserError(
            f"{key} is {what}, not a config: the module takes {key.split('.')[-1]} as a config "
            f"(its _target_ and values) and builds it, as litforge.models.ClassificationModule "
            f"does."
        )
    target = config.get("_target_")
    name = registered_name(target, allowed)
    listed = {"model.scheduler": "SCHEDULERS", "model.optimizer": "OPTIMIZERS"}.get(key, "NETWORKS")
    if name is None:
        raise UserError(
            f"{key}._target_={target} is not allowed: a checkpoint builds only what "
            f"litforge.models.{listed} lists (src/litforge/models/__init__.py); if it is yours, "
            f"add it there."
        )
    if not all(isinstance(k, str) for k in config):
        raise UserError(f"{key} has keys that are no names: {list(config)}.")
    keywords = {k for k in config if k.startswith("_") and k.endswith("_")} - {"_target_"}
    if keywords - ({"_partial_"} if partial else set()):
        raise UserError(
            f"{key} has {', '.join(sorted(keywords))}: a checkpoint's {key} is built from its "
            f"_target_ and plain values{' (and _partial_: true)' if partial else ''} only."
        )
    if partial and config.get("_partial_") is not True:
        raise UserError(f"{key}._partial_ must be true: the module gives it its parameters.")

    def refuse(value: Any, where: str) -> None:
        if isinstance(value, Mapping):
            if "_target_" in value and partial:
                raise UserError(
                    f"{where} has a _target_ of its own ({value['_target_']}): a checkpoint's "
                    f"{key} is built from plain values only."
                )
            if "_target_" in value and registered_name(value["_target_"], allowed) is None:
                raise UserError(
                    f"{where} has a _target_ of its own ({value['_target_']}), which "
                    f"litforge.models.{listed} does not list (src/litforge/models/__init__.py); "
                    f"if it is yours, add it there."
                )
            if "_target_" in value:
                check_buildable(value, where, allowed)
                return
            if not all(isinstance(k, str) for k in value):
                raise UserError(f"{where} has keys that are no names: {list(value)}.")
            for k, v in value.items():
                refuse(v, f"{where}.{k}")
        elif isinstance(value, Sequence) and not isinstance(value, str):
            for i, v in enumerate(value):
                refuse(v, f"{where}[{i}]")
        elif isinstance(value, str) and "${" in value:
            raise UserError(
                f"{where}={value} is an interpolation: a checkpoint holds plain values."
            )

    refuse({k: v for k, v in config.items() if k != "_target_"}, key)
    return {**config, "_target_": name}


def check_settings(
    input_shape: Any,
    num_classes: Any,
    class_names: Any = None,
    class_weights: Any = None,
    mean: Any = None,
    std: Any = None,
) -> None:
    """The module's plain settings are of the right kinds (a checkpoint's are data, never configs
    to build): a UserError naming the first that is not."""

    def listed(value: Any, kind: type | tuple[type, ...]) -> bool:
        return (
            isinstance(value, Sequence)
            and not isinstance(value, str)
            and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
        )

    from litforge.data.images import MAX_IMAGE_SIZE

    if not (listed(input_shape, int) and len(input_shape) == 3 and min(input_shape) > 0):
        raise UserError(f"input_shape={input_shape!r} is no (channels, height, width) of pixels.")
    if max(input_shape[1:]) > MAX_IMAGE_SIZE or input_shape[0] > 4:
        raise UserError(
            f"input_shape={input_shape!r} is out of range: images of 1 to 4 channels and at most "
            f"{MAX_IMAGE_SIZE} px a side."
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise UserError(f"num_classes={num_classes!r} is no number of classes (2 or more).")
    if num_classes > MAX_CLASSES:
        raise UserError(
            f"num_classes={num_classes} is out of range: at most {MAX_CLASSES:,} (the test "
            f"confusion matrix holds num_classes² counts: {MAX_CLASSES:,} classes take 800 MB)."
        )
    if class_names is not None and not listed(class_names, str):
        raise UserError(f"class_names={class_names!r} is no list of names.")
    for name, value in (("class_weights", class_weights), ("mean", mean), ("std", std)):
        if value is not None and not listed(value, (int, float)):
            raise UserError(f"{name}={value!r} is no list of numbers.")


def load_module(
    checkpoint: dict[str, Any], ckpt_path: str, target: str | None = None
) -> L.LightningModule:
    """The LightningModule of `target` (a trusted config's `_target_`; else the class of
    `litforge.models.MODULES` that the checkpoint names as its `module_class`, or the one class
    registered) with the checkpoint's settings and weights, which `read_checkpoint` has checked:
    a file through Lightning's `load_from_checkpoint`."""
    from hydra.utils import get_class

    from litforge.models import MODULES

    registered = {class_path(m): m for m in MODULES}
    trained_as = checkpoint.get("module_class")
    trained_as = trained_as if isinstance(trained_as, str) else None
    if target is None and trained_as not in registered and len(MODULES) != 1:
        raise UserError(
            f"{ckpt_path}: several LightningModules are registered in litforge.models.MODULES; "
            f"add model=<the model config it was trained with>."
        )
    module_class = get_class(target) if target else registered.get(trained_as, MODULES[0])
    if trained_as and trained_as != class_path(module_class):
        shown = repr(trained_as[:200])  # (the checkpoint's text: no control characters)
        fix = "" if target else " Add the class to litforge.models.MODULES to load it as such."
        warning_on_rank_zero(
            f"{ckpt_path} was written by the LightningModule {shown}: loading it as "
            f"{class_path(module_class)}.{fix}"
        )
    if "hyper_parameters" not in checkpoint:
        raise UserError(
            f"{ckpt_path} holds no hyper-parameters (its module did not call "
            f"save_hyperparameters): it cannot be rebuilt from the checkpoint alone."
        )
    if target:  # (read_checkpoint checked the settings for each class of MODULES)
        check_registered(checkpoint, ckpt_path, module_class)
    check_sizes(checkpoint, module_class, ckpt_path)
    if Path(ckpt_path).is_file():
        return module_class.load_from_checkpoint(ckpt_path, map_location="cpu", weights_only=True)
    model = module_class(**module_arguments(checkpoint, module_class))  # a folder of shards
    model.load_state_dict(checkpoint["state_dict"])
    return model


def check_sizes(checkpoint: dict[str, Any], module_class: type, ckpt_path: str) -> None:
    """The module its settings build has the shapes of the checkpoint's tensors: built on the
    meta device first (no memory), so that settings naming a larger network than the
    checkpoint holds are refused before anything is allocated."""
    try:
        with torch.device("meta"):
            model = module_class(**module_arguments(checkpoint, module_class))
    except UserError as err:
        raise UserError(f"{ckpt_path}: {err}") from None
    except Exception as err:  # settings that build nothing: any kind a constructor raises
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"{ckpt_path}: its settings build no module ({first_line[:200]}).") from err
    fix = "Its settings do not fit its weights: it was not written by train.py."
    check_same_shapes(checkpoint["state_dict"], model.state_dict(), ckpt_path, fix)


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
    trained_classes = (checkpoint.get("hyper_parameters") or {}).get("class_names")
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
