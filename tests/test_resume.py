"""Resuming (`ckpt_path=last`): a run killed (SIGKILL) or stopped (SIGTERM) and resumed ends
with the same weights and metrics as one that was never interrupted; a run resumed from an earlier
one writes into its own new folder."""

import csv
import json
import logging
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import lightning
import pytest
import torch
from helpers import (
    RESUMABLE,
    ROOT,
    assert_same_run,
    compose_config,
    final_state,
    run_in_process,
    run_script,
    small_cnn_args,
    tiny_run_args,
    write_image_folder,
)

from litforge.checkpoints import read
from litforge.errors import UserError
from litforge.pipeline import train

WRITTEN_BY = {"pytorch-lightning_version": lightning.__version__}  # in every checkpoint


def start(data_dir, run, *extra) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "train.py", *tiny_run_args(data_dir, run, *RESUMABLE, *extra)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop_after_first_checkpoint(process: subprocess.Popen, sig: signal.Signals) -> str:
    """Read the run's output until it reports its first last.ckpt, then send `sig`."""
    output = []
    for line in process.stdout:
        output.append(line)
        if "last.ckpt (epoch 0," in line:
            process.send_signal(sig)
            break
    rest, _ = process.communicate(timeout=120)
    return "".join(output) + rest


def csv_rows(run) -> list[dict[str, str]]:
    with (run / "csv" / "metrics.csv").open() as f:
        return [{k: v for k, v in row.items() if v} for row in csv.DictReader(f)]


def run_with_fault(data_dir, run, signal_name, stage, epoch, batch):
    """Run train.py, which sends itself `signal_name` after that batch (helpers.SendSignal)."""
    fault = [
        "+callbacks.fault._target_=helpers.SendSignal",
        f"+callbacks.fault.signal={signal_name}",
        f"+callbacks.fault.epoch={epoch}",
        f"+callbacks.fault.batch={batch}",
        f"+callbacks.fault.stage={stage}",
    ]
    return run_script(
        "train.py",
        *tiny_run_args(data_dir, run, *RESUMABLE, *fault),
        env={"PYTHONPATH": str(ROOT / "tests")},
    )


@pytest.fixture
def uninterrupted(tmp_path, idx_data_dir):
    run = tmp_path / "uninterrupted"
    result = run_in_process("train.py", *tiny_run_args(idx_data_dir, run, *RESUMABLE))
    assert result.returncode == 0, result.stderr[-3000:]
    return run


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_result(tmp_path, idx_data_dir, uninterrupted):
    run = tmp_path / "killed"
    output = stop_after_first_checkpoint(start(idx_data_dir, run), signal.SIGKILL)
    assert not (run / "metrics.json").exists(), "killed before the end:\n" + output[-2000:]
    logged_before = csv_rows(run)

    resumed = tiny_run_args(idx_data_dir, run, *RESUMABLE, "ckpt_path=last")
    result = run_in_process("train.py", *resumed)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Resuming from {run / 'checkpoints'}" in result.stdout + result.stderr
    assert_same_run(run, uninterrupted)
    # the CSV log keeps what the killed run wrote and goes on below it
    logged = csv_rows(run)
    assert logged[: len(logged_before)] == logged_before
    assert {"1", "2"} <= {row.get("epoch") for row in logged[len(logged_before) :]}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "batch", "step"),
    [("train", 6, 57), ("validate", 3, 100)],  # mid-epoch 1; in its validation (50 steps each)
)
def test_sigterm_saves_a_checkpoint_and_exits_cleanly(
    tmp_path, idx_data_dir, uninterrupted, stage, batch, step
):
    run = tmp_path / "stopped"
    stopped = run_with_fault(idx_data_dir, run, "SIGTERM", stage, epoch=1, batch=batch)
    output = stopped.stdout + stopped.stderr
    assert stopped.returncode == 143, output[-3000:]
    assert f"Stopped while training at epoch 1, step {step}" in output
    assert "Traceback" not in output
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == step

    resumed = tiny_run_args(idx_data_dir, run, *RESUMABLE, "ckpt_path=last")
    result = run_in_process("train.py", *resumed)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_run(run, uninterrupted)
    # the CSV log as the uninterrupted run's: one learning rate per epoch, none repeated
    rates = [[row for row in csv_rows(r) if "lr-AdamW" in row] for r in (run, uninterrupted)]
    assert rates[0] == rates[1] and len(rates[0]) == 3


def photo_folder_args(tmp_path) -> list[str]:
    """A run on a folder of 128×160 RGB photos with 2 loader workers, random crops, flips and
    dropout: what exact resuming has to draw again."""
    counts = {"train": {name: 24 for name in "abcd"}}
    images = write_image_folder(tmp_path / "images", counts, size=(128, 160))
    return [
        *small_cnn_args(images),
        "data.num_workers=2",
        "data.image_size=32",
        "data.batch_size=16",
        "data.crop_scale=[0.35,1]",
        "data.horizontal_flip=true",
        "model.net.dropout=0.3",
        "trainer.deterministic=true",
        "trainer.accelerator=cpu",
        "extras.print_config=false",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("data", ["image_folder", "in_memory"])
def test_a_run_resumed_from_an_epochs_end_trains_as_an_uninterrupted_one(
    tmp_path, idx_data_dir, data
):
    # epoch_000.ckpt is written at epoch 0's end (last.ckpt there too): the loader has no state
    # left to restore, and image folders' workers start reading before Lightning sets the epoch.
    if data == "image_folder":
        args = photo_folder_args(tmp_path)
    else:
        args = tiny_run_args(idx_data_dir, None, *RESUMABLE, "data.batch_size=50")
    args += ["trainer.max_epochs=2", "callbacks.model_checkpoint.save_top_k=-1"]  # all kept
    epoch_end = tmp_path / "uninterrupted" / "checkpoints" / "epoch_000.ckpt"
    for name, extra in (("uninterrupted", []), ("resumed", [f"ckpt_path={epoch_end}"])):
        result = run_script("train.py", *args, f"hydra.run.dir={tmp_path / name}", *extra)
        assert result.returncode == 0, result.stderr[-3000:]
    step, weights, metrics = final_state(tmp_path / "resumed")
    step_ref, weights_ref, metrics_ref = final_state(tmp_path / "uninterrupted")
    assert step == step_ref
    for name, value in weights_ref.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0, msg=name)
    # The test metrics too: the resumed run knows the best checkpoint of the epochs before it.
    assert metrics == metrics_ref


@pytest.mark.slow
def test_an_image_folder_run_killed_mid_epoch_resumes_to_the_same_test_loss(tmp_path):
    """kill -9 mid-epoch of a run reading RGB photos of 128×160 px with 2 loader workers and
    random crops and flips; resumed with ckpt_path=last, it ends as the uninterrupted run."""
    args = [
        *photo_folder_args(tmp_path),
        "trainer.max_epochs=2",
        "callbacks.rich_progress_bar=null",
        "callbacks.last_checkpoint.every_n_train_steps=2",  # mid-epoch: 4 batches an epoch
    ]
    reference = run_script("train.py", *args, f"hydra.run.dir={tmp_path / 'uninterrupted'}")
    assert reference.returncode == 0, reference.stderr[-3000:]
    run = tmp_path / "killed"
    killed = subprocess.Popen(
        [sys.executable, "train.py", *args, f"hydra.run.dir={run}"],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = stop_after_first_checkpoint(killed, signal.SIGKILL)
    assert "last.ckpt (epoch 0, step 2)" in output, output[-3000:]
    assert not (run / "metrics.json").exists()
    resumed = run_script("train.py", *args, f"hydra.run.dir={run}", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from" in resumed.stdout + resumed.stderr
    metrics = json.loads((run / "metrics.json").read_text())
    reference_metrics = json.loads((tmp_path / "uninterrupted" / "metrics.json").read_text())
    assert metrics["test/loss"] == reference_metrics["test/loss"]
    assert metrics == reference_metrics


@pytest.mark.slow
def test_sigterm_while_testing_exits_143_too(tmp_path, idx_data_dir):
    # Lightning's own SIGTERMException is a SystemExit with status 0: a stopped job would look done.
    stopped = run_with_fault(idx_data_dir, tmp_path / "run", "SIGTERM", "test", epoch=3, batch=0)
    assert stopped.returncode == 143
    assert "Stopped while testing" in stopped.stdout + stopped.stderr
    assert not (tmp_path / "run" / "metrics.json").exists()
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 150  # the end of training, not overwritten while testing


def test_ckpt_path_last_is_the_newest_last_checkpoint_of_this_runs_folder(tmp_path, caplog):
    """As in Lightning: `last` is the newest `last*.ckpt` of the run's checkpoint folders, or
    none yet (said: the run starts fresh); a run folder given means its last checkpoint."""
    from litforge.checkpoints import checkpoint_file

    caplog.set_level(logging.INFO)
    folder = tmp_path / "run" / "checkpoints"
    assert checkpoint_file("last", [folder]) is None
    assert f"No checkpoint in {folder} to resume (ckpt_path=last): starting fresh" in caplog.text
    folder.mkdir(parents=True)
    for age, name in enumerate(["last-v1.ckpt", "last.ckpt", "epoch_003.ckpt"]):
        (folder / name).write_bytes(b"PK\x03\x04")
        os.utime(folder / name, (1e9 + age, 1e9 + age))
    assert checkpoint_file("last", [folder]) == str(folder / "last.ckpt")
    assert checkpoint_file(str(tmp_path / "run"), [tmp_path]) == str(folder / "last.ckpt")
    assert checkpoint_file(str(folder / "epoch_003.ckpt"), []) == str(folder / "epoch_003.ckpt")


def test_a_last_checkpoint_cut_off_is_one_line(tmp_path):
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    last.write_bytes(b"PK\x03\x04 cut off by a crash")
    with pytest.raises(UserError, match=r"last.ckpt is not a readable checkpoint \("):
        read(last)


def test_resuming_with_another_optimizer_class_is_refused(tmp_path):
    from litforge.pipeline import check_fits

    adamw = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.001}
    checkpoint = {"state_dict": {}, "hyper_parameters": {"optimizer": adamw}}
    model = SimpleNamespace(
        hparams={"optimizer": {**adamw, "_target_": "torch.optim.SGD"}}, state_dict=dict
    )
    data = SimpleNamespace(hparams={}, class_names=["a", "b"], input_shape=(1, 2, 2))
    data.mean, data.std = [0.5], [0.5]
    with pytest.raises(UserError, match="model.optimizer._target_=torch.optim.SGD, but x.ckpt"):
        check_fits(checkpoint, "x.ckpt", model, data, fitting=True)
    check_fits(checkpoint, "x.ckpt", model, data, fitting=False)  # testing: no optimizer


@pytest.mark.slow
def test_resuming_a_finished_run_with_more_epochs_goes_on_at_a_learning_rate_above_0(
    tmp_path, idx_data_dir
):
    """`ckpt_path=last` in the run's folder (`hydra.run.dir`); its cosine schedule, configured
    to end at trainer.max_epochs, stretches to the new end instead of staying at 0. A new
    folder has no checkpoint yet: the run starts fresh, saying so."""
    logs = tmp_path / "logs"
    command = [*tiny_run_args(idx_data_dir, None), f"paths.log_dir={logs}"]
    first = run_in_process("train.py", *command)
    assert first.returncode == 0, first.stderr[-3000:]
    [run] = (logs / "train" / "runs").iterdir()

    short = ["trainer.limit_train_batches=1", "trainer.limit_val_batches=1", "test=false"]
    fresh = run_in_process("train.py", *command, *short, "ckpt_path=last")
    assert "to resume (ckpt_path=last): starting fresh" in fresh.stdout + fresh.stderr

    more = ["trainer.max_epochs=3", f"hydra.run.dir={run}", "ckpt_path=last"]
    longer = run_in_process("train.py", *command, *more)
    output = longer.stdout + longer.stderr
    assert longer.returncode == 0, output[-3000:]
    assert f"Resuming from {run / 'checkpoints' / 'last.ckpt'}" in output
    assert "the new schedule goes on from step 1, learning rate 0.00075" in output
    rates = [float(row["lr-AdamW"]) for row in csv_rows(run) if "lr-AdamW" in row]
    assert rates == pytest.approx([0.001, 0.00075, 0.00025])  # cos over 3 epochs, not 0


@pytest.mark.parametrize("dirpath", ["kept", "left out"])
def test_a_checkpoint_naming_a_file_outside_its_folder_deletes_nothing(
    tmp_path, idx_data_dir, caplog, dirpath
):
    """ModelCheckpoint deletes its saved k-th best file once a better one is saved, guarded by
    the words of the path: a crafted `<dir>/../../victim` in a resumed run's state is refused
    (with the state's own dirpath, or without it, when Lightning takes the current one)."""
    overrides = ["data=mnist", "data.val_size=100", "logger=none", f"paths.data_dir={idx_data_dir}"]
    train(compose_config("train", tmp_path, [*overrides, "trainer.max_epochs=1"]))
    victim = tmp_path / "victim"
    victim.write_text("mine")
    for path in (tmp_path / "run" / "checkpoints").glob("*.ckpt"):
        checkpoint = torch.load(path, weights_only=True)
        for state in checkpoint["callbacks"].values():
            if "best_k_models" in state:
                outside = f"{state['dirpath']}/../../victim"
                state["kth_best_model_path"] = outside
                state["best_k_models"] = {outside: torch.tensor(-1.0)}
                if dirpath == "left out":
                    del state["dirpath"]
        torch.save(checkpoint, path)

    resumed = [*overrides, "trainer.max_epochs=3", "ckpt_path=last"]  # in place: the same run
    with pytest.raises(UserError, match="/../../victim', which is no absolute path without '..'"):
        train(compose_config("train", tmp_path, resumed))
    assert victim.read_text() == "mine"


def test_a_run_resumed_into_a_new_folder_tests_the_best_checkpoint_so_far(tmp_path, idx_data_dir):
    """Resumed from epoch 0's end into its own folder, a run whose next epoch does not improve
    (a learning rate too small to change a prediction) saves no new best and tests epoch 0's,
    as the uninterrupted run does; Lightning alone would call its first epoch the best."""
    overrides = ["data=mnist", "data.val_size=100", "logger=none", f"paths.data_dir={idx_data_dir}"]
    overrides += ["model.optimizer.lr=1e-12", "model.net.batch_norm=false", "trainer.max_epochs=2"]
    uninterrupted = train(compose_config("train", tmp_path / "a", overrides))
    best = tmp_path / "a" / "run" / "checkpoints" / "epoch_000.ckpt"
    assert sorted(p.name for p in best.parent.iterdir()) == ["epoch_000.ckpt", "last.ckpt"]
    # last.ckpt holds the last epoch, not a best one (Lightning's save_last would keep epoch 0's)
    assert torch.load(best.with_name("last.ckpt"), weights_only=True)["epoch"] == 1

    resumed = train(compose_config("train", tmp_path / "b", [*overrides, f"ckpt_path={best}"]))
    assert [p.name for p in (tmp_path / "b" / "run" / "checkpoints").iterdir()] == ["last.ckpt"]
    assert resumed == uninterrupted


def test_a_checkpoint_of_lightning_before_2_is_refused(tmp_path):
    """Lightning's migrations of older formats move settings and file paths (a best checkpoint
    to delete: `checkpoint_callback_best_model_path`) from keys of their own: refused."""
    from helpers import write_cnn_checkpoint

    path = write_cnn_checkpoint(tmp_path / "cnn.ckpt", 32)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["pytorch-lightning_version"] = "0.9.0"
    checkpoint["checkpoint_callback_best_model_path"] = "local:///victim"
    torch.save(checkpoint, path)
    with pytest.raises(UserError, match="was written by Lightning 0.9.0, before 2.0"):
        read(path)
    del checkpoint["pytorch-lightning_version"]
    torch.save(checkpoint, path)
    with pytest.raises(UserError, match="names no Lightning version that wrote it"):
        read(path)


def test_lightning_migrates_only_checkpoints_before_2_0():
    """`read` checks a checkpoint as it is (no migration): true only while Lightning migrates no
    checkpoint of 2.0 or later. A Lightning that does fails here: check the migrated one then."""
    from lightning.pytorch.utilities.migration import migration
    from packaging.version import Version

    assert max(Version(v) for v in migration._migration_index()) <= Version("2.0")


def test_a_checkpoint_naming_a_file_through_a_link_deletes_nothing(tmp_path, idx_data_dir, caplog):
    """Resumed in place, a run's checkpoint callback forgets the files its saved state names
    outside its folder once links are followed (a link in the run folder, made by anyone)."""
    overrides = ["data=mnist", "data.val_size=100", "logger=none", f"paths.data_dir={idx_data_dir}"]
    train(compose_config("train", tmp_path, [*overrides, "trainer.max_epochs=1"]))
    folder = tmp_path / "run" / "checkpoints"
    victim = tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    victim.write_text("mine")
    (folder / "link").symlink_to(victim.parent)
    for path in folder.glob("*.ckpt"):
        checkpoint = torch.load(path, weights_only=True)
        for state in checkpoint["callbacks"].values():
            if state.get("best_k_models"):
                linked = str(folder / "link" / "victim")
                state["kth_best_model_path"] = linked
                state["best_k_models"] = {linked: torch.tensor(-1.0)}
        torch.save(checkpoint, path)

    resumed = [*overrides, "trainer.max_epochs=3", "ckpt_path=last"]  # in place: the same run
    train(compose_config("train", tmp_path, resumed))
    assert "link/victim', outside this run's checkpoints" in caplog.text
    assert victim.read_text() == "mine"
