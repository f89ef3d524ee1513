"""`trainer=gpu` on a CUDA GPU: every core model in float32 and bf16-mixed, compiled, on image
folders with loader workers and pinned memory; a GPU checkpoint evaluated on the CPU; DDP over
NCCL with two GPUs. `make test-gpu` runs the GPU tests of every folder; without a GPU they skip.
"""

import json
import math

import pytest
import torch
from helpers import (
    compose_config,
    free_port,
    photo,
    run_in_process,
    run_script,
    tiny_run_args,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")


@pytest.fixture(autouse=True)
def _torch_defaults():
    """Each test starts from torch's defaults: `trainer=gpu` changes them for the process."""
    matmul, benchmark = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = False
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.benchmark = benchmark


def gpu_args(data_dir, run_dir, *extra: str) -> list[str]:
    """A seconds-long `trainer=gpu` run on the small MNIST files in `data_dir`."""
    return [*tiny_run_args(data_dir, run_dir), "trainer=gpu", "trainer.accelerator=gpu", *extra]


def train_on_gpu(tmp_path, data_dir, *extra: str) -> tuple[str, dict[str, float]]:
    """Run `train.py` with `gpu_args`; its output and metrics.json."""
    run_dir = tmp_path / "run"
    result = run_in_process("train.py", *gpu_args(data_dir, run_dir, *extra))
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "GPU available: True (cuda), used: True" in output
    return output, json.loads((run_dir / "metrics.json").read_text())


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_model_trains_an_epoch_on_the_gpu(tmp_path, idx_data_dir, model, precision):
    output, metrics = train_on_gpu(
        tmp_path, idx_data_dir, f"model={model}", f"trainer.precision={precision}"
    )
    assert math.isfinite(metrics["train/loss"]) and "test/acc" in metrics
    assert ("bfloat16 Automatic Mixed Precision" in output) == (precision == "bf16-mixed")
    # trainer=gpu's TF32 matmuls and cuDNN autotuning, whatever the precision
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.benchmark


def test_trainer_gpu_defaults_leave_lightning_nothing_to_advise(tmp_path, idx_data_dir):
    # A process of its own: Lightning gives its matmul precision advice once per process.
    run_dir = tmp_path / "run"
    result = run_script("train.py", *gpu_args(idx_data_dir, run_dir, "model=cnn"))
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "bfloat16 Automatic Mixed Precision" in output
    assert "set_float32_matmul_precision" not in output


def test_compiled_model_trains_on_the_gpu(tmp_path, idx_data_dir):
    _, metrics = train_on_gpu(tmp_path, idx_data_dir, "model=cnn", "model.compile=true")
    assert math.isfinite(metrics["train/loss"])


def test_gpu_checkpoint_evaluates_on_the_cpu(tmp_path, idx_data_dir):
    # float32 without TF32: the CPU's test then sees the same logits, up to rounding.
    exact = ("trainer.precision=32-true", "trainer.float32_matmul_precision=highest")
    _, trained = train_on_gpu(tmp_path, idx_data_dir, "model=cnn", *exact)
    best = next((tmp_path / "run" / "checkpoints").glob("epoch_*.ckpt"))
    eval_dir = tmp_path / "eval"
    result = run_in_process(
        "eval.py",
        f"ckpt_path={best}",
        "trainer=cpu",
        "data=mnist",
        f"paths.data_dir={idx_data_dir}",
        f"hydra.run.dir={eval_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = json.loads((eval_dir / "metrics.json").read_text())
    assert evaluated["test/acc"] == pytest.approx(trained["test/acc"], abs=0.01)
    assert evaluated["test/loss"] == pytest.approx(trained["test/loss"], rel=1e-3)


@pytest.fixture
def photos(tmp_path):
    """`photos/train/<class>/`: RGB JPEGs of 128 to 224 px, a class per colour cast."""
    root = tmp_path / "photos"
    for label in range(3):
        folder = root / "train" / f"class{label}"
        folder.mkdir(parents=True)
        for i in range(24):
            side = 128 + (i * 8) % 97  # 128 to 224 px
            (folder / f"{i:03d}.jpg").write_bytes(photo(100 * label + i, side, side))
    return root


def image_folder_args(root) -> list[str]:
    return [
        "data=image_folder",
        f"data.root={root}",
        "data.image_size=128",
        "data.batch_size=16",
        "data.num_workers=4",
    ]


def test_image_folder_batches_come_pinned_from_loader_workers(tmp_path, photos):
    from litforge.pipeline import build_datamodule, build_trainer

    cfg = compose_config("train", tmp_path, ["trainer=gpu", *image_folder_args(photos)])
    datamodule, trainer = build_datamodule(cfg), build_trainer(cfg)
    datamodule.trainer = trainer  # as `trainer.fit` sets it
    datamodule.setup("fit")
    images, _, _ = next(iter(datamodule.train_dataloader()))  # (and the files left out)
    assert images.is_pinned()  # so Lightning's non-blocking copy to the GPU is asynchronous


def test_image_folder_trains_on_the_gpu(tmp_path, photos):
    run_dir = tmp_path / "run"
    args = [*image_folder_args(photos), "model=cnn", "trainer=gpu", "trainer.max_epochs=1"]
    result = run_in_process("train.py", *args, "logger=none", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test/acc" in json.loads((run_dir / "metrics.json").read_text())


@TWO_GPUS
def test_ddp_over_nccl_on_two_gpus(tmp_path, idx_data_dir):
    run_dir = tmp_path / "run"
    result = run_script(
        "train.py",
        *gpu_args(idx_data_dir, run_dir, "strategy=ddp", "trainer.devices=2"),
        env={"MASTER_PORT": str(free_port())},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "distributed_backend=nccl" in output
    assert "sync_dist=True" not in output  # epoch values are logged with sync_dist
    assert "test/acc" in json.loads((run_dir / "metrics.json").read_text())
