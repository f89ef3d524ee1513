"""`callbacks.provenance`: what produced a run, in `<run>/provenance.json`."""

import json
import logging
import subprocess

import pytest
import torch
import yaml
from helpers import compose_config

from litforge.pipeline import evaluate, train

FAST = ["data=mnist", "data.val_size=100", "data.batch_size=64", "trainer.max_epochs=1"]


def project(folder, dirty: bool):
    """A git checkout with one commit (and, `dirty`, a changed and an untracked file)."""
    folder.mkdir()
    for args in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        subprocess.run(["git", "-C", str(folder), *args], check=True)
    (folder / "train.py").write_text("print('v1')\n")
    (folder / "requirements").mkdir()
    (folder / "requirements" / "dev.txt").write_text("torch==2\n")
    subprocess.run(["git", "-C", str(folder), "add", "."], check=True)
    subprocess.run(["git", "-C", str(folder), "commit", "-qm", "v1"], check=True)
    if dirty:
        (folder / "train.py").write_text("print('v2')\n")
        (folder / "notes.txt").write_text("new\n")
    commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True)
    return commit.stdout.decode().strip()


def test_a_run_from_a_dirty_tree_records_its_commit_and_keeps_the_diff(tmp_path, idx_data_dir):
    commit = project(tmp_path / "repo", dirty=True)
    (tmp_path / "repo" / ".installed-from").write_text("requirements/dev.txt 00ff\n")
    root = f"+callbacks.provenance.root={tmp_path / 'repo'}"
    train(compose_config("train", tmp_path, [*FAST, "logger=csv", root]))
    run = tmp_path / "run"
    record = json.loads((run / "provenance.json").read_text())
    assert record["git"]["commit"] == commit and record["git"]["dirty"] is True
    assert "notes.txt" in record["git"]["untracked"]
    diff = (run / "provenance.diff").read_text()
    assert "-print('v1')" in diff and "+print('v2')" in diff
    # the lock's hash when installed, against the checkout's file now
    assert record["lock"] == {
        "file": "requirements/dev.txt",
        "sha256": "00ff",
        "matches_checkout": False,
    }
    assert record["versions"]["torch"] == torch.__version__
    assert record["versions"]["lightning"] and record["hardware"]["cpus"] >= 1
    assert record["command"].startswith("python")  # (here: the test process's own)
    assert record["started"][:4].isdigit()
    # sent to the loggers with the run config, and kept in checkpoints
    [hparams] = run.glob("**/hparams.yaml")
    assert yaml.safe_load(hparams.read_text())["provenance"]["git"]["commit"] == commit
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["callbacks"]
    assert {"commit": commit, "dirty": True} in saved.values()


def test_eval_says_the_commit_a_checkpoint_was_trained_at_and_that_it_differs(
    tmp_path, idx_data_dir, caplog
):
    first = project(tmp_path / "repo", dirty=False)
    root = f"+callbacks.provenance.root={tmp_path / 'repo'}"
    train(compose_config("train", tmp_path, [*FAST, "logger=none", root]))
    (tmp_path / "repo" / "train.py").write_text("print('v2')\n")
    repo = ["git", "-C", str(tmp_path / "repo")]
    subprocess.run([*repo, "commit", "-qam", "v2"], check=True)
    best = next((tmp_path / "run" / "checkpoints").glob("epoch_*.ckpt"))
    data = f"paths.data_dir={idx_data_dir}"
    with caplog.at_level(logging.INFO, logger="litforge.provenance.record"):
        evaluate(
            compose_config("eval", tmp_path / "b", [f"ckpt_path={best}", "data=mnist", data, root])
        )
    said = caplog.text
    assert f"The checkpoint was trained at commit {first}." in said
    assert f"The checkpoint was trained at commit {first}, this checkout is at" in said
    assert not (tmp_path / "b" / "run" / "provenance.diff").exists()  # a clean tree


def test_predict_and_export_say_the_commit_a_checkpoint_was_trained_at(  # feature: deploy
    tmp_path, idx_data_dir, caplog
):
    from PIL import Image

    from litforge.deploy.export import export
    from litforge.deploy.predict import predict

    first = project(tmp_path / "repo", dirty=False)
    root = f"+callbacks.provenance.root={tmp_path / 'repo'}"
    train(compose_config("train", tmp_path, [*FAST, "logger=none", "test=false", root]))
    (tmp_path / "repo" / "train.py").write_text("print('v2')\n")
    subprocess.run(["git", "-C", str(tmp_path / "repo"), "commit", "-qam", "v2"], check=True)
    image = tmp_path / "digit.png"
    Image.new("L", (28, 28)).save(image)
    read = [f"ckpt_path={tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}", root]
    for command, name, more in [(predict, "predict", [f"input={image}"]), (export, "export", [])]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="litforge.provenance.record"):
            command(compose_config(name, tmp_path / name, [*read, *more]))
        assert f"trained at commit {first}, this checkout is at" in caplog.text, name


def test_outside_a_git_checkout_it_says_so_and_goes_on(tmp_path):
    from litforge.provenance import collect

    record, diff = collect(tmp_path, started=__import__("datetime").datetime.now())
    assert record["git"]["commit"] is None and diff is None
    assert "is no git checkout" in record["git"]["note"]
    assert record["lock"]["file"] is None


@pytest.mark.parametrize("commit", ["$(touch x)", "\x1b[2J" * 20, None, 7])
def test_a_checkpoints_commit_that_is_no_commit_is_not_shown(tmp_path, commit, caplog):
    from litforge.provenance import RecordProvenance

    callback = RecordProvenance(str(tmp_path), root=str(tmp_path))
    callback.record = {"git": {"commit": "a" * 40}}
    with caplog.at_level(logging.INFO):
        callback.load_state_dict({"commit": commit, "dirty": True})
    assert "names no commit" in caplog.text and "\x1b" not in caplog.text


def test_untracked_files_alone_leave_the_tree_clean_and_a_non_utf8_change_is_kept(tmp_path):
    from litforge.provenance import collect

    project(tmp_path / "repo", dirty=False)
    (tmp_path / "repo" / "notes.txt").write_text("new\n")
    record, diff = collect(tmp_path / "repo", started=__import__("datetime").datetime.now())
    assert record["git"]["dirty"] is False and record["git"]["untracked"] == ["notes.txt"]
    assert diff is None
    (tmp_path / "repo" / "train.py").write_bytes("print('été')\n".encode("latin-1"))
    record, diff = collect(tmp_path / "repo", started=__import__("datetime").datetime.now())
    assert record["git"]["dirty"] is True and b"print('\xe9t\xe9')" in diff


def test_a_run_resumed_into_its_folder_keeps_the_earlier_record(tmp_path):
    from litforge.provenance import RecordProvenance

    project(tmp_path / "repo", dirty=True)
    run = tmp_path / "run"
    for _ in range(2):  # the first start, then a requeued one
        callback = RecordProvenance(str(run), root=str(tmp_path / "repo"))
        callback.record = {"git": {"dirty": True}}
        callback.write(b"the changes")
    assert sorted(p.name for p in run.iterdir()) == [
        "provenance-1.diff",
        "provenance-1.json",
        "provenance.diff",
        "provenance.json",
    ]


@pytest.mark.parametrize("state", [[1], "x", {"commit": "a" * 40}])
def test_a_checkpoint_state_of_another_shape_or_a_run_outside_git_says_nothing_wrong(
    tmp_path, state, caplog
):
    from litforge.provenance import RecordProvenance

    callback = RecordProvenance(str(tmp_path), root=str(tmp_path))
    callback.record = {"git": {"commit": None}}  # this run: outside a checkout
    with caplog.at_level(logging.INFO):
        callback.load_state_dict(state)
    assert "this checkout is at" not in caplog.text
