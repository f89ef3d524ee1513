"""A checkpoint trained on a CUDA GPU exports (export.py) and predicts on the CPU (predict.py) the
classes the GPU gave in its test. `make test-gpu`; skipped without a GPU."""

import csv

import pytest
import torch
from helpers import run_in_process, small_cnn_args, write_image_folder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_gpu_checkpoint_exports_and_predicts_on_the_cpu(tmp_path):
    counts = {"a": 30, "b": 30, "c": 30}
    root = write_image_folder(
        tmp_path / "images", {"train": counts, "test": dict.fromkeys(counts, 8)}
    )
    record = tmp_path / "probabilities.pt"
    result = run_in_process(
        "train.py",
        *small_cnn_args(root),
        "trainer=gpu",
        # float32 without TF32: the CPU then computes what the GPU did, up to rounding
        "trainer.precision=32-true",
        "trainer.float32_matmul_precision=highest",
        "+callbacks.record._target_=helpers.RecordTestProbabilities",
        f"+callbacks.record.path={record}",
        f"hydra.run.dir={tmp_path / 'train'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = next((tmp_path / "train" / "checkpoints").glob("epoch_*.ckpt"))
    on_gpu = torch.load(record)  # N×3, in the test loader's order: by class, then name
    test_files = sorted((root / "test").rglob("*.*"))

    result = run_in_process(
        "export.py",
        f"ckpt_path={checkpoint}",
        "format=onnx",
        f"export.sample_input={root / 'test'}",  # checked there against the checkpoint
        f"hydra.run.dir={tmp_path / 'export'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    model = tmp_path / "export" / "model.onnx"

    result = run_in_process(
        "predict.py",
        f"model_path={model}",
        f"input={root / 'test'}",
        "predict.device=cpu",
        "predict.top_k=1",
        f"hydra.run.dir={tmp_path / 'predict'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "predict" / "predictions.csv", newline="") as f:
        rows = {row["path"]: row for row in csv.DictReader(f)}
    assert len(rows) == len(test_files)
    names = sorted(counts)
    for path, expected in zip(test_files, on_gpu, strict=True):
        row = rows[str(path)]
        assert row["label"] == names[int(expected.argmax())], path
        assert float(row["probability"]) == pytest.approx(expected.max().item(), abs=1e-3)
