"""`data=streaming`: `python -m litforge.streaming optimize` on real image files, then training from
the LitData shards — on one process, on two (DDP), and resumed after a kill -9."""

import json
import logging
import re

import pytest
import torch
from helpers import (
    ROOT,
    assert_option_builds,
    assert_same_run,
    compose_config,
    run_in_process,
    run_script,
    train_recording_samples,
    write_image_folder,
    write_numbered_folder,
)

from litforge.data.image_folder import ImageFolderDataModule
from litforge.errors import UserError

pytest.importorskip("litdata", reason="data=streaming needs litdata: pip install -e '.[dev]'")

from litforge.data.base import model_arguments
from litforge.pipeline import train  # noqa: E402
from litforge.streaming.datamodule import META_FILE, StreamingDataModule, optimize_folder  # noqa: E402

CLASSES = ("cat", "dog", "fox")


def optimize_cli(source, output, *extra):
    return run_in_process("-m", "litforge.streaming", "optimize", str(source), str(output), *extra)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """A small folder of PNG and JPEG files, and its shards made by the command line."""
    tmp = tmp_path_factory.mktemp("streaming")
    source = write_image_folder(
        tmp / "images",
        {"train": dict.fromkeys(CLASSES, 30), "test": dict.fromkeys(CLASSES, 6)},
    )
    result = optimize_cli(source, tmp / "shards", "--workers", "2", "--image-size", "20")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Shards in" in result.stdout
    return source, tmp / "shards"


def test_the_config_composes_resolves_and_builds(tmp_path, monkeypatch, shards):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    overrides = ["data=streaming", f"data.input_dir={shards[1]}", "data.num_workers=0"]
    assert assert_option_builds(tmp_path, overrides) is not None


def test_optimize_writes_the_splits_image_folder_would_use(shards):
    source, output = shards
    meta = json.loads((output / META_FILE).read_text())
    folder = ImageFolderDataModule(root=str(source), image_size=20, num_workers=0)
    folder.inspect()
    assert meta["class_names"] == list(CLASSES)
    for split in ("train", "val", "test"):
        assert meta["counts"][split] == [len(folder.splits[split][c]) for c in CLASSES]
        assert (output / split / "index.json").is_file()
    assert (meta["channels"], meta["image_size"]) == (3, 20)
    assert meta["mean"] == folder.mean and meta["std"] == folder.std


def test_shards_of_pixels_give_the_batches_shards_of_files_give(shards, tmp_path):
    source, files = shards
    pixels = tmp_path / "pixels"
    optimize_folder(str(source), str(pixels), store="pixels", num_workers=2, image_size=20)
    assert json.loads((pixels / META_FILE).read_text())["store"] == "pixels"
    samples = []
    for input_dir in (files, pixels):
        datamodule = StreamingDataModule(input_dir=str(input_dir), batch_size=16, num_workers=0)
        datamodule.setup("test")
        images = [
            (image.numpy().tobytes(), int(label))
            for batch in datamodule.test_dataloader()
            for image, label, _ in zip(*batch, strict=True)  # (and its index)
        ]
        samples.append(sorted(images))  # LitData's workers may lay the chunks out in any order
    assert len(samples[0]) == 18 and samples[0] == samples[1]
    with pytest.raises(UserError, match="holds 3-channel pixels, data.channels=1"):
        model_arguments(StreamingDataModule(input_dir=str(pixels), channels=1))


def test_test_samples_carry_the_index_that_reads_them_back(shards):
    _, output = shards
    datamodule = StreamingDataModule(input_dir=str(output), batch_size=4, num_workers=2)
    datamodule.setup("test")
    loader = datamodule.test_dataloader()
    seen = [
        (image, int(index))
        for images, _, indices in loader
        for image, index in zip(images, indices, strict=True)
    ]
    assert sorted(index for _, index in seen) == list(range(18))
    for image, index in seen:  # LitData's workers stream the chunks in an order of their own
        assert torch.equal(loader.dataset[index][0], image)


def train_on_shards(tmp_path, shards_dir, epochs: int, *overrides: str) -> dict[str, float]:
    cfg = compose_config(
        "train",
        tmp_path,
        [
            "data=streaming",
            f"data.input_dir={shards_dir}",
            "data.batch_size=16",
            f"trainer.max_epochs={epochs}",
            "trainer.accelerator=cpu",
            "callbacks.rich_progress_bar=null",
            *overrides,
        ],
    )
    return train(cfg)


def test_training_on_shards_learns_and_logs_what_it_read(shards, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    _, output = shards
    metrics = train_on_shards(tmp_path, output, 3)
    assert metrics["test/acc"] >= 0.9  # the bands are easy
    log = caplog.text
    assert f"Data: streaming from {output}: 3 classes, 3×20×20" in log
    assert "Training images per class: 27 cat, 27 dog, 27 fox" in log


def test_an_untrained_model_draws_its_mistakes_read_back_from_the_shards(  # feature: plots
    shards, tmp_path
):
    _, output = shards
    metrics = train_on_shards(tmp_path, output, 1, "model.optimizer.lr=1e-9", "data.num_workers=2")
    assert metrics["test/acc"] < 0.9
    drawn = (tmp_path / "run" / "plots" / "mistakes.png").read_bytes()
    assert drawn.startswith(b"\x89PNG") and len(drawn) > 2_000


def test_shards_are_resized_and_augmented_as_image_folders_are(shards, tmp_path):
    source, output = shards
    settings = {"image_size": 16, "interpolation": "nearest", "auto_augment": "trivialaugment"}
    streamed = StreamingDataModule(input_dir=str(output), num_workers=0, **settings)
    folder = ImageFolderDataModule(root=str(source), num_workers=0, **settings)
    for datamodule in (streamed, folder):
        datamodule.inspect()
    for train_time in (True, False):
        assert streamed.sample_transform(train_time) == folder.sample_transform(train_time)
    train_on_shards(
        tmp_path, output, 1, "data.mix=cutmix", *(f"data.{k}={v}" for k, v in settings.items())
    )
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["input_shape"] == [3, 16, 16]
    # What eval.py, predict.py and serve.py resize new images with.
    assert checkpoint["datamodule_hyper_parameters"]["interpolation"] == "nearest"


def test_a_file_that_does_not_decode_stops_optimize_or_is_left_out(tmp_path, capsys):
    source = write_image_folder(tmp_path / "images", {"train": {"cat": 4, "dog": 4}})
    bad = source / "train" / "dog" / "0002.png"
    bad.write_bytes(b"\x89PNG broken")
    split = ["--val-fraction", "0", "--test-fraction", "0", "--workers", "1"]
    result = optimize_cli(source, tmp_path / "stopped", *split)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: cannot decode {bad}")
    assert not (tmp_path / "stopped").exists()  # nothing half-written
    output = tmp_path / "skipped"
    optimize_folder(str(source), str(output), 0, 0, on_bad_file="skip", num_workers=1)
    assert f"Left out 1 files that did not decode, e.g. {bad}" in capsys.readouterr().out
    assert json.loads((output / META_FILE).read_text())["counts"]["train"] == [4, 3]


def test_what_cannot_stream_is_one_clear_error(tmp_path, shards):
    source, output = shards
    with pytest.raises(UserError, match="exists and is not empty"):
        optimize_folder(str(source), str(output))
    with pytest.raises(UserError, match="holds no streaming shards.*litforge.streaming optimize"):
        model_arguments(StreamingDataModule(input_dir=str(tmp_path)))
    with pytest.raises(UserError, match="balance=sampler needs random access"):
        StreamingDataModule(input_dir=str(output), balance="sampler")
    gray = model_arguments(StreamingDataModule(input_dir=str(output), channels=1))
    assert (gray["mean"], gray["std"]) == ([0.449], [0.226])  # ImageNet's, for one channel


@pytest.mark.slow
def test_two_processes_train_on_every_sample_once_per_epoch(tmp_path):
    # 96 training samples (and 24 to validate), 2 processes × batches of 8: nothing for
    # LitData to even out.
    source = write_numbered_folder(tmp_path / "images", 120)
    output = tmp_path / "shards"
    split = ["--val-fraction", "0.2", "--test-fraction", "0", "--workers", "2"]
    split += ["--image-size", "8", "--channels", "1"]
    assert optimize_cli(source, output, *split).returncode == 0
    per_rank = train_recording_samples(
        tmp_path, "data=streaming", f"data.input_dir={output}", "data.num_workers=2"
    )
    for epoch in (0, 1):
        a, b = per_rank[(epoch, 0)], per_rank[(epoch, 1)]
        assert len(a) == len(b) == 48  # the same number of steps on both
        assert len(a + b) == len(set(a + b)) == 96  # every training sample exactly once
        assert set(a + b) == set(per_rank[(0, 0)] + per_rank[(0, 1)])  # the same ones
    assert per_rank[(0, 0)] != per_rank[(1, 0)]  # reshuffled each epoch


@pytest.mark.slow
def test_killed_mid_epoch_resumes_to_the_same_result(tmp_path, shards):
    # The mechanisms are data=image_folder's too (its loader's own resume: test_image_folder.py).
    _, output = shards
    common = [
        "data=streaming",
        f"data.input_dir={output}",
        "data.batch_size=8",
        "data.crop_scale=[0.6,1]",
        "data.horizontal_flip=true",
        "model.net.dropout=0.3",
        "trainer.max_epochs=2",
        "trainer.accelerator=cpu",
        "trainer.deterministic=true",
        "callbacks.last_checkpoint.every_n_train_steps=5",  # divides the epoch: 5, 10, 15
        "callbacks.rich_progress_bar=null",
    ]
    whole = run_in_process("train.py", *common, f"hydra.run.dir={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    run = tmp_path / "killed"
    fault = [  # killed after batch 6 of epoch 1 (10 an epoch), at step 17: saved at step 15
        "+callbacks.fault._target_=helpers.SendSignal",
        "+callbacks.fault.signal=SIGKILL",
        "+callbacks.fault.epoch=1",
        "+callbacks.fault.batch=6",
    ]
    env = {"PYTHONPATH": str(ROOT / "tests")}
    killed = run_script("train.py", *common, *fault, f"hydra.run.dir={run}", env=env)
    assert killed.returncode == -9 and not (run / "metrics.json").exists()
    assert "(epoch 1, step 15)" in (run / "train.log").read_text()  # a mid-epoch checkpoint
    resumed = run_in_process("train.py", *common, "ckpt_path=last", f"hydra.run.dir={run}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(run, tmp_path / "whole")


@pytest.mark.slow
def test_mlp_reaches_85_percent_streaming_exported_fashion_mnist(tmp_path, fashion_mnist_folder):
    output = tmp_path / "shards"
    small = ["--image-size", "28", "--channels", "1"]
    assert optimize_cli(fashion_mnist_folder, output, "--workers", "2", *small).returncode == 0
    cfg = compose_config(
        "train",
        tmp_path,
        [
            "data=streaming",
            f"data.input_dir={output}",
            "data.batch_size=256",
            "trainer.max_epochs=2",
            "callbacks.rich_progress_bar=null",
        ],
    )
    assert train(cfg)["test/acc"] >= 0.85


def test_optimize_names_its_own_arguments_in_its_errors(tmp_path):
    """optimize's errors name its arguments (SOURCE, --on-bad-file), not train.py's data.*."""
    missing = optimize_cli(tmp_path / "nowhere", tmp_path / "out")
    assert missing.returncode == 1
    line = missing.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: the source folder {tmp_path / 'nowhere'} is no folder"), line
    source = write_image_folder(tmp_path / "images", {"train": {"cat": 2, "dog": 2}})
    (source / "train" / "dog" / "0000.png").write_bytes(b"\x89PNG broken")  # a sampled file
    broken = optimize_cli(source, tmp_path / "out2", "--workers", "1")
    line = broken.stderr.strip().splitlines()[-1]
    assert line.startswith("error: cannot decode") and "set --on-bad-file skip to" in line, line
    assert "data." not in line


def test_shards_left_unnamed_are_one_line(tmp_path):
    """`data.input_dir: ???` in the option file: said before Hydra would end in a traceback."""
    cfg = compose_config("train", tmp_path, ["data=streaming"])
    with pytest.raises(UserError, match=r"^data\.input_dir is not set: give the OUT_DIR of `py"):
        train(cfg)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"val_fraction": 1.0}, "--val-fraction=1.0: must be < 1."),
        ({"num_workers": 0}, "--workers=0: must be > 0."),
        ({"image_size": 5000}, "--image-size=5000: must be <= 4096."),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "their sum must be below 1."),
    ],
)
def test_bad_optimize_options_are_one_line_before_reading(tmp_path, arguments, message):
    with pytest.raises(UserError, match=re.escape(message)):
        optimize_folder(str(tmp_path / "none"), str(tmp_path / "out"), **arguments)
    assert not (tmp_path / "out").exists()
