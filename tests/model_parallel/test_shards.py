"""Folders of shards (litforge/model_parallel/shards.py): `python -m litforge.model_parallel
to-file` puts one together into the checkpoint file the other commands take, and refuses a folder
cut off in one line; resuming from one checks its `meta.pt` as the core checks a file, and its
shards' metadata builds nothing but metadata. Folders written here in one process, as
Lightning's ModelParallelStrategy lays them out (real runs' folders: test_parallelize.py and
test_stages.py)."""

import pickle
import re

import pytest
import torch
from helpers import run_in_process, tiny_run_args, write_cnn_checkpoint

from litforge import checkpoints
from litforge.errors import UserError
from litforge.model_parallel import ModelParallelStrategy
from litforge.model_parallel.shards import read_meta, to_file


def write_folder(folder, checkpoint_file, **meta_changes):
    """The checkpoint file as a folder of shards: its weights and an AdamW's state (whose
    settings torch stores as pickled values) in torch.distributed.checkpoint's shards, the
    rest in `meta.pt`, changed by `meta_changes`."""
    import torch.distributed.checkpoint as dcp

    checkpoint = torch.load(checkpoint_file, weights_only=True)
    weights = checkpoint.pop("state_dict")
    parameters = [w.clone().requires_grad_() for w in weights.values() if w.is_floating_point()]
    optimizer = torch.optim.AdamW(parameters)
    sum(p.sum() for p in parameters).backward()
    optimizer.step()
    checkpoint.pop("optimizer_states", None)
    shards = {"state_dict": weights, "optimizer_0": optimizer.state_dict()}
    dcp.save(shards, storage_writer=dcp.FileSystemWriter(folder), no_dist=True)
    torch.save({**checkpoint, **meta_changes}, folder / "meta.pt")
    return folder


@pytest.fixture
def checkpoint_file(tmp_path):
    return write_cnn_checkpoint(tmp_path / "original.ckpt", 32)


@pytest.fixture
def folder(tmp_path, checkpoint_file):
    return write_folder(tmp_path / "checkpoints" / "last.ckpt", checkpoint_file)


def to_file_command(*args: str):
    return run_in_process("-m", "litforge.model_parallel", "to-file", *map(str, args))


def test_a_folder_becomes_one_file_the_other_commands_take(tmp_path, folder, checkpoint_file):
    from litforge.deploy.inference import load_classifier

    result = to_file_command(folder)
    assert result.returncode == 0, result.stderr
    written = folder.with_name("last.pt")  # not last*.ckpt, which ckpt_path=last would take
    assert f"Wrote {written}" in result.stdout
    checkpoint = checkpoints.read(written)
    original = torch.load(checkpoint_file, weights_only=True)
    assert checkpoint["state_dict"].keys() == original["state_dict"].keys()
    for key, tensor in original["state_dict"].items():
        assert torch.equal(checkpoint["state_dict"][key], tensor), key
    assert checkpoint["hyper_parameters"] == original["hyper_parameters"]
    # what only resuming needs stays in the folder
    assert not {"optimizer_states", "lr_schedulers", "callbacks"} & checkpoint.keys()
    classifier = load_classifier(written)  # as predict.py, export.py and serve.py load it
    assert classifier.class_names == ["bird", "cat", "dog"]
    # a path of one's own
    assert to_file(folder, tmp_path / "elsewhere" / "model.ckpt").is_file()


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        ("meta.pt", "is no whole folder of shards (it lacks meta.pt: its writing was cut off"),
        (".metadata", "is no whole folder of shards (it lacks .metadata: its writing was cut off"),
        ("shard", "its shard __0_0.distcp is cut off (the folder's writing was cut off"),
    ],
)
def test_a_folder_cut_off_is_refused_in_one_line(tmp_path, folder, cut, message):
    if cut == "shard":
        shard = folder / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[:1000])
    else:
        (folder / cut).unlink()
    result = to_file_command(folder, tmp_path / "whole.ckpt")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not (tmp_path / "whole.ckpt").exists()


def test_shard_metadata_builds_only_metadata(folder):
    class Code:
        def __reduce__(self):
            return (print, ("ran",))

    (folder / ".metadata").write_bytes(pickle.dumps(Code()))
    with pytest.raises(UserError, match=r"no metadata of shards \(builtins.print is no shard"):
        read_meta(folder)


def test_a_pickled_value_in_the_shards_must_be_plain_data(tmp_path, checkpoint_file):
    import datetime

    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "last.ckpt"
    shards = {"state_dict": {}, "optimizer_0": {"when": datetime.date(2020, 1, 1)}}
    dcp.save(shards, storage_writer=dcp.FileSystemWriter(folder), no_dist=True)
    torch.save(torch.load(checkpoint_file, weights_only=True), folder / "meta.pt")
    with pytest.raises(UserError, match="its value optimizer_0.when is no plain data"):
        read_meta(folder)


FOREIGN = {
    "a callback's path with ..": (
        {"callbacks": {"ModelCheckpoint": {"best_model_path": "/runs/a/../../victim"}}},
        "names the file '/runs/a/../../victim', which is no absolute path without '..'",
    ),
    "an image size out of range": (
        {"hyper_parameters": {"input_shape": [1, 99999, 99999]}},
        "input_shape=[1, 99999, 99999] is out of range",
    ),
}


@pytest.mark.parametrize("case", FOREIGN)
def test_resuming_checks_the_folders_meta_as_the_core_checks_a_file(
    tmp_path, checkpoint_file, idx_data_dir, case
):
    changes, message = FOREIGN[case]
    folder = write_folder(tmp_path / "last.ckpt", checkpoint_file, **changes)
    # the strategy's loading (resuming, and testing with train=false) on every process
    with pytest.raises(UserError, match=re.escape(message)):
        ModelParallelStrategy().load_checkpoint(folder)
    # and before the processes start, in one line
    args = tiny_run_args(idx_data_dir, tmp_path / "run", "strategy=model_parallel")
    result = run_in_process("train.py", *args, "trainer.devices=2", f"ckpt_path={folder}")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: ckpt_path={folder}") and message in last, last


def test_eval_and_loaders_given_a_folder_of_shards_name_the_strategy_that_reads_it(tmp_path):
    folder = tmp_path / "run" / "checkpoints" / "last.ckpt"
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"")
    with pytest.raises(UserError, match="is a folder of shards: the strategy that wrote it"):
        checkpoints.read(folder)
