"""`tune=lr`, `tune=batch_size`: Lightning's finders before training."""

import json
import logging
import re

import pytest
import torch
import yaml
from helpers import ROOT, compose_config, run_script, write_image_folder

from litforge.errors import UserError
from litforge.pipeline import train

FAST = ["data=mnist", "data.val_size=100", "data.batch_size=32", "logger=none"]
SHORT = ["callbacks.lr_finder.num_training_steps=40"]


def test_tune_lr_writes_the_curve_and_a_suggestion_in_the_range_it_swept(tmp_path, idx_data_dir):
    metrics = train(compose_config("train", tmp_path, [*FAST, "tune=lr", *SHORT]))
    run = tmp_path / "run"
    assert (run / "tune" / "lr_find.png").read_bytes().startswith(b"\x89PNG")
    found = json.loads((run / "tune" / "lr_find.json").read_text())
    assert min(found["lr"]) <= found["suggestion"] <= max(found["lr"])
    assert min(found["lr"]) >= 1e-6 and max(found["lr"]) <= 1
    saved = json.loads((run / "metrics.json").read_text())
    assert saved["tune/lr"] == pytest.approx(found["suggestion"], rel=1e-6)
    assert metrics["tune/lr"] == pytest.approx(found["suggestion"], rel=1e-6)
    assert "test/acc" not in saved  # finding only: nothing trained, nothing tested


def test_tune_apply_trains_an_rgb_image_folder_at_the_suggested_rate(tmp_path):
    root = write_image_folder(tmp_path / "photos", {"train": {"cat": 24, "dog": 24}}, (128, 160))
    data = ["data=image_folder", f"data.root={root}", "data.image_size=128", "data.num_workers=0"]
    overrides = [*data, "data.batch_size=4", "logger=csv", "trainer.max_epochs=2"]  # 11 a epoch
    finder = ["tune=lr", "tune.apply=true", "callbacks.lr_finder.num_training_steps=20"]
    train(compose_config("train", tmp_path, [*overrides, *finder]))
    run = tmp_path / "run"
    suggestion = json.loads((run / "tune" / "lr_find.json").read_text())["suggestion"]
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["hyper_parameters"]["optimizer"]["lr"] == pytest.approx(suggestion)
    assert [g["lr"] for g in last["optimizer_states"][0]["param_groups"]][0] <= suggestion
    assert "test/acc" in json.loads((run / "metrics.json").read_text())
    logged = yaml.safe_load(next(run.glob("csv/**/hparams.yaml")).read_text())
    assert logged["tune/lr"] == pytest.approx(suggestion) and logged["tune"]["apply"] is True


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["tune=lr", "strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu"],
            "tune=lr runs in one process (Lightning's finder): add trainer.devices=1",
        ),
        (
            ["tune=lr", "callbacks.lr_finder.min_lr=1", "callbacks.lr_finder.max_lr=0.1"],
            "callbacks.lr_finder.min_lr=1 must be below callbacks.lr_finder.max_lr=0.1.",
        ),
        (  # the finder under a name of yours
            [
                "tune=lr",
                "~callbacks.lr_finder",
                "+callbacks.finder._target_=litforge.tuning.FindLearningRate",
                "+callbacks.finder.dirpath=tune",
                "+callbacks.finder.max_lr=1e-7",
            ],
            "callbacks.finder.min_lr=1e-06 must be below callbacks.finder.max_lr=1e-07.",
        ),
        (
            ["tune=batch_size", "trainer.accelerator=cpu"],
            "tune=batch_size sizes batches for an accelerator's memory: run it on a GPU",
        ),
        (["tune=lr", "tune.apply=maybe"], "=maybe: must be true or false."),
    ],
)
def test_what_a_finder_cannot_do_is_one_line(tmp_path, overrides, message):
    with pytest.raises(UserError, match=re.escape(message)):
        train(compose_config("train", tmp_path, ["paths.data_dir=/nonexistent", *overrides]))


@pytest.mark.slow
def test_a_sweep_runs_the_finder_in_each_job(tmp_path, idx_data_dir):
    result = run_script(
        str(ROOT / "train.py"),
        "-m",
        "tune=lr",
        "data=mnist",
        "data.val_size=100",
        "data.batch_size=32",
        "callbacks.lr_finder.num_training_steps=30",
        "model.optimizer.weight_decay=0,0.01",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        found = json.loads((tmp_path / "sweep" / job / "tune" / "lr_find.json").read_text())
        metrics = json.loads((tmp_path / "sweep" / job / "metrics.json").read_text())
        assert metrics["tune/lr"] == pytest.approx(found["suggestion"], rel=1e-6)


def test_a_resumed_run_does_not_search_again(tmp_path):
    from litforge.tuning import FindLearningRate

    finder = FindLearningRate(str(tmp_path), apply=True)
    finder.load_state_dict({"suggestion": 0.01})
    finder.on_fit_start(None, None)  # (no search: it would need the trainer)
    assert finder.state_dict() == {"suggestion": 0.01}
    finder.load_state_dict({"suggestion": "0.01; rm -rf"})  # a checkpoint's: only a number
    assert finder.rate is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_batch_size_finder_grows_the_batch_on_a_gpu_then_trains_with_it(
    tmp_path, idx_data_dir, caplog
):
    caplog.set_level(logging.INFO)
    overrides = ["data=mnist", "data.val_size=100", "data.batch_size=2", "logger=none"]
    overrides += ["trainer=gpu", "tune=batch_size", "callbacks.batch_size_finder.max_trials=3"]
    metrics = train(compose_config("train", tmp_path, [*overrides, "trainer.max_epochs=1"]))
    assert "test/acc" in metrics
    # Three trials, each fits a GPU's memory: 2, 4, 8.
    assert "continue with full run using batch size 8" in caplog.text
