"""`strategy=model_parallel`: FSDP2 and tensor parallelism over CPU processes (gloo), both
checkpoint formats, resuming from each, and single-device evaluation of the result."""

import json
import subprocess
import sys

import pytest
import torch
from helpers import free_port, run_script, tiny_run_args

MP = ["strategy=model_parallel", "strategy.timeout.minutes=3"]


def train(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    result = run_script("train.py", *args, env={"MASTER_PORT": str(free_port())}, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def evaluate(ckpt, data_dir, out_dir) -> dict:
    result = run_script(
        "eval.py",
        f"ckpt_path={ckpt}",
        "data=mnist",
        f"paths.data_dir={data_dir}",
        f"hydra.run.dir={out_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out_dir / "metrics.json").read_text())


@pytest.mark.slow
def test_fsdp2_sharded_checkpoints_consolidate_evaluate_and_resume(tmp_path, idx_data_dir):
    run_dir = tmp_path / "run"
    args = tiny_run_args(
        idx_data_dir,
        run_dir,
        *MP,
        "trainer.devices=2",
        "trainer.precision=bf16-mixed",
        "trainer.gradient_clip_val=1.0",
    )
    train(*args)
    last = run_dir / "checkpoints" / "last.ckpt"
    assert last.is_dir(), "save_distributed_checkpoint=true writes a folder of shards"

    refused = run_script(
        "eval.py",
        f"ckpt_path={last}",
        "data=mnist",
        f"paths.data_dir={idx_data_dir}",
        f"hydra.run.dir={tmp_path / 'e0'}",
    )
    assert refused.returncode == 1
    assert "python -m lightning.fabric.utilities.consolidate_checkpoint" in refused.stderr

    best = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    subprocess.run(
        [sys.executable, "-m", "lightning.fabric.utilities.consolidate_checkpoint", str(best)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    evaluated = evaluate(f"{best}.consolidated", idx_data_dir, tmp_path / "e1")
    trained = json.loads((run_dir / "metrics.json").read_text())
    assert evaluated["test/acc"] == pytest.approx(trained["test/acc"], abs=1e-6)

    resumed_dir = tmp_path / "resumed"
    train(
        *tiny_run_args(
            idx_data_dir,
            resumed_dir,
            *MP,
            "trainer.devices=2",
            "trainer.max_epochs=2",
            f"ckpt_path={last}",
            "test=false",
        )
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning.fabric.utilities.consolidate_checkpoint",
            str(resumed_dir / "checkpoints" / "last.ckpt"),
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    state = torch.load(resumed_dir / "checkpoints" / "last.ckpt.consolidated", weights_only=True)
    assert state["epoch"] == 1 and state["global_step"] == 2 * 5  # 500 images / (2 x 50) per step


@pytest.mark.slow
def test_tensor_parallel_cnn_single_file_checkpoint_evaluates_and_resumes(tmp_path, idx_data_dir):
    run_dir = tmp_path / "run"
    common = [
        "model=cnn",
        "model.net.channels=[8]",
        "model.net.hidden_size=16",
        *MP,
        "trainer.devices=2",
        "strategy.data_parallel_size=1",
        "strategy.tensor_parallel_size=2",
        "strategy.save_distributed_checkpoint=false",
    ]
    result = train(*tiny_run_args(idx_data_dir, run_dir, *common))
    # tensor-parallel ranks share their data: one data-parallel replica
    assert (
        "Batch size: 50 per process x 1 data-parallel process(es)" in result.stdout + result.stderr
    )
    best = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    assert best.is_file()
    evaluated = evaluate(best, idx_data_dir, tmp_path / "e")
    trained = json.loads((run_dir / "metrics.json").read_text())
    assert evaluated["test/acc"] == pytest.approx(trained["test/acc"], abs=0.011)  # ±1 image

    resumed = tmp_path / "resumed"
    train(
        *tiny_run_args(
            idx_data_dir,
            resumed,
            *common,
            "trainer.max_epochs=2",
            f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}",
            "test=false",
        )
    )
    state = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["epoch"] == 1 and state["global_step"] == 20


@pytest.mark.slow
def test_two_by_two_mesh_on_four_processes(tmp_path, idx_data_dir):
    run_dir = tmp_path / "run"
    result = train(
        *tiny_run_args(
            idx_data_dir,
            run_dir,
            "model=cnn",
            "model.net.channels=[4]",
            "model.net.hidden_size=8",
            *MP,
            "trainer.devices=4",
            "strategy.tensor_parallel_size=2",
            "trainer.limit_train_batches=2",
            "trainer.limit_val_batches=1",
            "trainer.limit_test_batches=1",
        ),
        timeout=500,
    )
    assert "x 2 data-parallel process(es)" in result.stdout + result.stderr
    assert (run_dir / "metrics.json").is_file()
