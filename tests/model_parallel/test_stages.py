"""`strategy.pipeline_parallel_size` > 1 (litforge/model_parallel/stages.py): stages of the
network on their own processes (gloo on CPUs), run by torch.distributed.pipelining's schedules.
Each run's steps, losses and consolidated weights equal one process training on the same global
batches, and its folder of shards, put together into one file (`python -m litforge.model_parallel
to-file`), evaluates on one device to its own test accuracy."""

import json

import pytest
import torch
from helpers import (
    compose_config,
    free_port,
    model_weights,
    predicted_accuracy,
    run_script,
    tiny_run_args,
)

from litforge.checkpoints import read
from litforge.errors import UserError
from litforge.model_parallel.shards import read_meta, to_file
from litforge.pipeline import train as train_in_process

STEPS = 6  # optimizer steps of every run below
GLOBAL_BATCH = 32
MLP = ["model.net.hidden_sizes=[32,32,32]", "model.net.dropout=0"]  # 4 blocks: 4 stages at most


def run(tmp_path, name: str, *args: str, progress_bar: bool = False) -> dict:
    """train.py in a subprocess (its own port); the run's final metrics and weights."""
    run_dir = tmp_path / name
    env = {"MASTER_PORT": str(free_port())}
    network = [] if "model=cnn" in args else MLP
    base = tiny_run_args(
        tmp_path / "data", run_dir, *network, "logger=none", *args, progress_bar=progress_bar
    )
    result = run_script("train.py", *base, env=env, timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    weights = read(to_file(run_dir / "checkpoints" / "last.ckpt"))["state_dict"]  # a folder
    return {"metrics": metrics, "weights": weights, "dir": run_dir}


def run_in_process(tmp_path, name: str, *args: str) -> dict:
    """The same for a one-process run, in this process (no start-up to pay)."""
    out = tmp_path / name
    overrides = [*tiny_run_args(tmp_path / "data", None), *MLP, "logger=none", *args]
    metrics = train_in_process(compose_config("train", out, overrides))
    weights = read(out / "run" / "checkpoints" / "last.ckpt")["state_dict"]
    return {"metrics": metrics, "weights": weights, "dir": out / "run"}


def pipeline(*args: str, devices: int = 2) -> list[str]:
    return [
        "strategy=model_parallel",
        "strategy.timeout.minutes=3",
        f"trainer.devices={devices}",
        "strategy.pipeline_parallel_size=2",
        *args,
    ]


def assert_same_training(run: dict, reference: dict) -> None:
    for name in ("train/loss", "val/loss", "val/acc", "test/acc"):
        assert run["metrics"][name] == pytest.approx(reference["metrics"][name], abs=1e-5), name
    assert run["weights"].keys() == reference["weights"].keys()
    for key, expected in model_weights(reference["weights"]).items():
        torch.testing.assert_close(run["weights"][key], expected, atol=1e-5, rtol=0, msg=key)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from helpers import write_idx_dataset

    root = tmp_path_factory.mktemp("pipeline")
    write_idx_dataset(root / "data" / "MNIST" / "raw", n_train=600, n_test=200)
    return root


@pytest.fixture(scope="module")
def accumulating(data):
    """One process: each global batch as 4 microbatches of 8, gradients accumulated."""
    return run_in_process(
        data,
        "accumulating",
        "data.batch_size=8",
        "trainer.accumulate_grad_batches=4",
        f"trainer.limit_train_batches={4 * STEPS}",
    )


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "interleaved_1f1b"])
def test_two_stages_train_as_one_process_accumulating_microbatches(data, accumulating, schedule):
    piped = run(
        data,
        schedule,
        *pipeline(f"strategy.schedule={schedule}", "strategy.microbatches=4"),
        f"data.batch_size={GLOBAL_BATCH}",
        f"trainer.limit_train_batches={STEPS}",
    )
    assert_same_training(piped, accumulating)
    # the folder of shards is the single-device checkpoint: put together into one file,
    # predict/eval take it on one device
    best = next((piped["dir"] / "checkpoints").glob("epoch_*.ckpt"))
    assert best.is_dir()
    accuracy = predicted_accuracy(to_file(best), data / "data")
    assert accuracy == pytest.approx(piped["metrics"]["test/acc"], abs=1e-6)

    if schedule == "gpipe":  # and resumes: ckpt_path=last continues the run's own folder
        resumed = run(
            data,
            schedule,
            *pipeline(f"strategy.schedule={schedule}", "strategy.microbatches=4"),
            f"data.batch_size={GLOBAL_BATCH}",
            f"trainer.limit_train_batches={STEPS}",
            "trainer.max_epochs=2",
            "ckpt_path=last",
        )
        state = read_meta(resumed["dir"] / "checkpoints" / "last.ckpt")
        assert (state["epoch"], state["global_step"]) == (1, 2 * STEPS)


@pytest.mark.slow
def test_pipeline_times_data_parallel_on_four_processes(data):
    """2 stages × 2 data-parallel replicas (1F1B) against one process on the same global
    batches. Without batch norm: the replicas' microbatches group samples differently, which
    only batch statistics would notice."""
    no_bn = ["model.net.batch_norm=false", f"trainer.limit_train_batches={STEPS}"]
    reference = run_in_process(data, "one_process", f"data.batch_size={GLOBAL_BATCH}", *no_bn)
    piped = run(
        data,
        "pp2_dp2",
        *pipeline("strategy.schedule=1f1b", "strategy.microbatches=2", devices=4),
        f"data.batch_size={GLOBAL_BATCH // 2}",  # per data-parallel replica
        *no_bn,
    )
    assert_same_training(piped, reference)


@pytest.mark.slow
def test_cnn_in_two_stages_of_two_tensor_parallel_processes(data):
    """The README's 3-D example: the CNN (channels-last convolutions) cut into its convolution
    blocks and head, each stage tensor-parallel over 2 processes; its folder of shards, put
    together into one file, reads on one device to the run's own test accuracy. With the
    progress bar, as a user runs it (the processes other than rank 0 skip it)."""
    piped = run(
        data,
        "cnn_pp2_tp2",
        *pipeline("strategy.tensor_parallel_size=2", "strategy.microbatches=4", devices=4),
        "model=cnn",
        "model.net.channels=[8,8]",
        "model.net.hidden_size=16",
        "model.net.pool_size=7",  # the whole map: a band's row is its class
        f"data.batch_size={GLOBAL_BATCH}",
        f"trainer.limit_train_batches={STEPS}",
        progress_bar=True,
    )
    best = next((piped["dir"] / "checkpoints").glob("epoch_*.ckpt"))
    accuracy = predicted_accuracy(to_file(best), data / "data")
    assert accuracy == pytest.approx(piped["metrics"]["test/acc"], abs=1e-6)
    assert piped["metrics"]["train/loss"] < 2.3  # below chance: it learned


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.devices=3"], r"must multiply to trainer.devices x trainer.num_nodes = 3"),
        (["strategy.microbatches=3"], "strategy.microbatches=3 does not divide data.batch_size"),
        (["strategy.schedule=zigzag"], "strategy.schedule=zigzag: must be one of: gpipe, 1f1b"),
        (["strategy.microbatches=1"], "needs at least one microbatch per stage"),
        (
            [
                "model.scheduler._target_=torch.optim.lr_scheduler.ReduceLROnPlateau",
                "~model.scheduler.T_max",
                "+model.scheduler.monitor=val/loss",
            ],
            "ReduceLROnPlateau is not supported",
        ),
        (
            ["strategy.schedule=interleaved_1f1b", "strategy.microbatches=5", "data.batch_size=50"],
            "needs strategy.microbatches",
        ),
        (["trainer.gradient_clip_val=1.0"], "trainer.gradient_clip_val is not supported"),
        (["model=cnn", "model.net.mirror_average=true"], "mirror_average is not supported"),
        (["debug=default"], "trainer.detect_anomaly is not supported"),
        (["trainer.precision=bf16-mixed"], "trainer.precision=bf16-mixed is not supported"),
        (["strategy.save_distributed_checkpoint=false"], "save_distributed_checkpoint=false"),
        (
            ["strategy.schedule=interleaved_1f1b", "model.net.hidden_sizes=[32]"],
            "needs 4 stages, but MLP has 2 blocks",
        ),
    ],
)
def test_impossible_pipelines_are_one_line_errors_before_launch(
    tmp_path, idx_data_dir, overrides, message
):
    cfg = compose_config(
        "train",
        tmp_path,
        [*tiny_run_args(idx_data_dir, None), *pipeline(), "data.batch_size=32", *overrides],
    )
    with pytest.raises(UserError, match=message):
        train_in_process(cfg)
