"""`strategy=model_parallel` on CUDA GPUs: FSDP2 on one device, tensor parallelism when there are
two. Subprocesses: the strategy sets up a process group. `make test-gpu`; skipped without a GPU."""

import json

import pytest
import torch
from helpers import free_port, run_script, tiny_run_args

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def train_sharded(tmp_path, data_dir, *extra: str) -> dict[str, float]:
    run_dir = tmp_path / "run"
    result = run_script(
        "train.py",
        *tiny_run_args(data_dir, run_dir),
        "trainer=gpu",
        "trainer.accelerator=gpu",
        "strategy=model_parallel",
        "strategy.timeout.minutes=3",
        *extra,
        env={"MASTER_PORT": str(free_port())},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((run_dir / "metrics.json").read_text())


def test_fsdp2_on_one_gpu(tmp_path, idx_data_dir):
    metrics = train_sharded(tmp_path, idx_data_dir, "model=cnn", "trainer.devices=1")
    assert "test/acc" in metrics


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_tensor_parallel_mesh_on_two_gpus(tmp_path, idx_data_dir):
    metrics = train_sharded(
        tmp_path,
        idx_data_dir,
        "trainer.devices=2",
        "strategy.data_parallel_size=1",
        "strategy.tensor_parallel_size=2",
    )
    assert "test/acc" in metrics
