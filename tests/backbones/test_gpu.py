"""`model=timm` on a CUDA GPU: a tiny timm network (no weights) trains in float32 and bf16-mixed,
and fine-tunes from a local weights file. `make test-gpu`; skipped without a GPU."""

import json

import pytest
import torch
from helpers import run_in_process

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def train_on_gpu(tmp_path, args: list[str]) -> dict[str, float]:
    run_dir = tmp_path / "run"
    gpu = ["trainer=gpu", "trainer.accelerator=gpu", "data.num_workers=2"]
    result = run_in_process("train.py", *args, *gpu, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "GPU available: True (cuda), used: True" in result.stdout + result.stderr
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_timm_network_trains_an_epoch_on_the_gpu(tmp_path, colour_images, timm_args, precision):
    metrics = train_on_gpu(tmp_path, timm_args(colour_images, f"trainer.precision={precision}"))
    assert "test/acc" in metrics


def test_fine_tuning_from_local_weights_on_the_gpu(tmp_path, colour_images, timm_args, weights):
    args = timm_args(colour_images, f"model.net.pretrained_file={weights}", "trainer.max_epochs=3")
    metrics = train_on_gpu(tmp_path, args)
    assert metrics["test/acc"] > 0.5  # three colours: chance is a third
