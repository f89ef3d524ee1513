"""`make bench-gpu` (benchmarks/gpu.py) in its short CPU mode, on small Fashion-MNIST files: each
part runs and prints its markdown table."""

import pytest
from helpers import ROOT, run_script, write_idx_dataset


@pytest.mark.slow  # ~1 min: every setup of every part, and a train.py subprocess
def test_quick_cpu_run_prints_every_table(tmp_path):
    write_idx_dataset(tmp_path / "data" / "FashionMNIST" / "raw")
    result = run_script(
        "benchmarks/gpu.py",
        "--device=cpu",
        "--quick",
        f"paths.data_dir={tmp_path / 'data'}",
        "data.val_size=100",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.stdout.split("## make bench-gpu: all tables")[-1]
    assert "| small-step | 32-true |" in report and "| small-step | bf16-mixed |" in report
    assert "| `python train.py experiment=fashion_mnist_cnn trainer=cpu" in report
    assert "(Host-GPU syncs: counted on GPUs only)" in report
    if (ROOT / "benchmarks" / "finetune_throughput.py").is_file():  # (a lean copy may lack it)
        assert "| 64 | training |" in report and "| 64 | evaluation |" in report
