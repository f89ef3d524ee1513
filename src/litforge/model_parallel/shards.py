"""Folders of shards (`strategy.save_distributed_checkpoint=true`): torch.distributed.checkpoint's
shards and `.metadata`, beside Lightning's `meta.pt` (everything but the weights and optimizer
states). The strategy that wrote one resumes and tests from it (`strategy.py`); `to_file` puts its
weights together into one checkpoint file, which eval.py and every command that takes a checkpoint
file take: `python -m litforge.model_parallel to-file FOLDER [FILE]`. `read_folder` checks its
`meta.pt` as the core's `checkpoints.read` checks a file, and its shards' metadata, for both."""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

from litforge import checkpoints
from litforge.errors import UserError

META = "meta.pt"  # Lightning's (lightning.fabric.strategies.model_parallel._METADATA_FILENAME)
SHARDS_METADATA = ".metadata"  # torch.distributed.checkpoint's, written once all shards are
# Left out of the file: what only resuming needs, kept in the folder (as Lightning's
# `save_weights_only=True` checkpoints leave them out).
RESUME_ONLY = ("optimizer_states", "lr_schedulers", "callbacks")


def is_whole(folder: str | Path) -> bool:
    """Both halves written: the shards' `.metadata` (torch writes it last) and `meta.pt`
    (Lightning's rank 0 writes it after the shards)."""
    folder = Path(folder)
    return (folder / SHARDS_METADATA).is_file() and (folder / META).is_file()


def check_whole(folder: Path, where: str) -> None:
    if not folder.is_dir():
        raise UserError(f"{where}: no such folder.")
    if not is_whole(folder):
        missing = " and ".join(n for n in (SHARDS_METADATA, META) if not (folder / n).is_file())
        raise UserError(
            f"{where} is no whole folder of shards (it lacks {missing}: its writing was cut off, "
            f"or it is another folder). Give a folder a run with "
            f"strategy.save_distributed_checkpoint=true wrote."
        )


# What torch.distributed.checkpoint pickles into `.metadata`: its own metadata classes, torch's
# dtypes, sizes and layouts, and the path it was saved to. Nothing else is built from it.
METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "StorageMeta",
        "MetadataIndex",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(vars(torch).get(name), torch.dtype)
        if not dtype and name not in METADATA_CLASSES.get(module, ()):
            raise pickle.UnpicklingError(f"{module}.{name} is no shard metadata")
        return super().find_class(module, name)


def check_metadata(folder: Path, where: str) -> Any:
    """The shards' `.metadata` (a pickle, which torch reads as it is), unpickled building only
    what torch writes there (`METADATA_CLASSES`); the shards it names are files in the folder,
    and its values that are no tensors (an optimizer's settings, which torch reads with
    `torch.load(weights_only=False)`) load with `weights_only=True`. Returns it."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        Metadata,
        MetadataIndex,
    )

    try:
        with (folder / SHARDS_METADATA).open("rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except Exception as err:  # any kind, on foreign bytes
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(
            f"{where}: its {SHARDS_METADATA} is no metadata of shards ({first_line[:200]})."
        ) from None
    entries = getattr(metadata, "storage_data", None)
    if not isinstance(metadata, Metadata) or not isinstance(entries, dict):
        raise UserError(f"{where}: its {SHARDS_METADATA} is no metadata of shards.")
    sizes: dict[str, int] = {}
    for index, stored in entries.items():
        if not (
            isinstance(index, MetadataIndex)
            and isinstance(stored, _StorageInfo)
            and all(isinstance(n, int) and n >= 0 for n in (stored.offset, stored.length))
        ):
            raise UserError(f"{where}: its {SHARDS_METADATA} is no metadata of shards.")
        name = stored.relative_path
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
            raise UserError(
                f"{where}: its {SHARDS_METADATA} names {str(name)[:200]!r}, no file of the folder."
            )
        if name not in sizes:
            sizes[name] = (folder / name).stat().st_size if (folder / name).is_file() else -1
        if sizes[name] < stored.offset + stored.length:
            raise UserError(
                f"{where}: its shard {name} is {'cut off' if sizes[name] >= 0 else 'missing'} "
                f"(the folder's writing was cut off, or a file was lost)."
            )
        if not isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        if stored.transform_descriptors:
            raise UserError(f"{where}: {index.fqn} is stored transformed, which is not read.")
        try:
            with (folder / name).open("rb") as f:
                f.seek(stored.offset)
                torch.load(io.BytesIO(f.read(stored.length)), weights_only=True)
        except Exception as err:
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UserError(
                f"{where}: its value {index.fqn[:200]} is no plain data ({first_line[:200]})."
            ) from None
    return metadata


def read_meta(folder: str | Path) -> dict[str, Any]:
    """The folder's `meta.pt`, all checked (`read_folder`)."""
    return read_folder(folder)[1]


def read_folder(folder: str | Path) -> tuple[Any, dict[str, Any]]:
    """The whole folder's shards' metadata (checked by `check_metadata`) and `meta.pt`, checked
    as `checkpoints.read` checks a checkpoint file: read with `weights_only=True`, written by
    Lightning 2.0 or later, callback states naming files only as Lightning writes them
    (`check_callback_paths`), the data's settings of the right kinds and sizes (`check_data`).
    A UserError saying why not."""
    folder = Path(folder).expanduser()
    where = f"ckpt_path={folder}"
    check_whole(folder, where)
    metadata = check_metadata(folder, where)
    try:
        meta = torch.load(folder / META, map_location="cpu", weights_only=True)
    except Exception as err:  # torch.load raises many kinds on foreign bytes
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"{where}: its {META} is not readable ({first_line[:200]}).") from err
    if not isinstance(meta, dict):
        raise UserError(f"{where}: its {META} is no Lightning checkpoint's metadata.")
    checkpoints.check_version(meta, where)
    checkpoints.check_callback_paths(meta, where)
    checkpoints.check_data(meta, where)
    return metadata, meta


def read_weights(folder: Path, metadata: Any, where: str) -> dict[str, Any]:
    """The weights of all shards, put together on the CPU (the optimizer states are not read),
    from the folder's checked `metadata` (`check_metadata`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    # Lightning saves the module's weights under "state_dict", which torch flattens into
    # "state_dict.<name>": the empty tensors of the same names are loaded into.
    prefix, weights = "state_dict.", {}
    for key, stored in metadata.state_dict_metadata.items():
        if key.startswith(prefix):
            is_tensor = isinstance(stored, TensorStorageMetadata)
            empty = torch.empty(stored.size, dtype=stored.properties.dtype) if is_tensor else None
            weights[key.removeprefix(prefix)] = empty
    if not weights:
        raise UserError(f"{where} holds no weights (no 'state_dict' in its shards).")
    state = {"state_dict": weights}
    try:
        with warnings.catch_warnings():  # ("... assuming the intent is to load in a single
            warnings.filterwarnings("ignore", ".*in a single process")  # process": it is)
            dcp.load(state, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
    except Exception as err:  # a shard cut off or missing: torch's CheckpointException, ...
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(
            f"{where}: its shards are not readable ({first_line[:200]}): its writing was cut "
            f"off, or a file is missing."
        ) from None
    return state["state_dict"]


def default_file(folder: Path) -> Path:
    """`<name>.pt` beside the folder (`last.ckpt/` → `last.pt`): not `*.ckpt`, which
    `ckpt_path=last` would take for the newest `last*.ckpt` to resume from."""
    name = folder.name.removesuffix(".ckpt") or folder.name
    return folder.with_name(f"{name}.pt")


def to_file(folder: str | Path, file: str | Path | None = None) -> Path:
    """The whole folder of shards `folder` as one Lightning checkpoint file, `file` (default:
    `default_file`), written atomically: its weights put together, with what `meta.pt` holds but
    the states only resuming needs (`RESUME_ONLY`: resume from the folder). Checked by
    `checkpoints.read` once written."""
    folder = Path(folder).expanduser()
    where = f"ckpt_path={folder}"
    if folder.is_file():
        raise UserError(f"{folder} is a file already: eval.py and the others take it as it is.")
    metadata, meta = read_folder(folder)
    target = Path(file).expanduser() if file else default_file(folder)
    if target.is_dir():
        raise UserError(f"{target} is a folder: give the path of the file to write.")
    checkpoint = {k: v for k, v in meta.items() if k not in RESUME_ONLY}
    checkpoint["state_dict"] = read_weights(folder, metadata, where)
    checkpoints.AtomicCheckpointIO().save_checkpoint(checkpoint, target)
    try:
        checkpoints.read(target)
    except UserError:
        target.unlink()
        raise
    return target
