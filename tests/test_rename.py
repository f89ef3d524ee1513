"""`scripts/rename_package.py`: a project made from the template runs under its own name."""

import shutil
import subprocess
import sys

import pytest
from helpers import ROOT, run_script, write_idx_dataset


@pytest.mark.slow
def test_renamed_copy_trains_under_the_new_name(tmp_path):
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    copy = tmp_path / "myproject"
    for name in files:
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)

    result = subprocess.run(
        [sys.executable, "scripts/rename_package.py", "mynet"],
        cwd=copy,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout
    assert (copy / "src" / "mynet" / "pipeline.py").is_file()
    assert not (copy / "src" / "litforge").exists()
    if (ROOT / "src" / "hydra_plugins").is_dir():  # the sweeps feature folder
        assert (copy / "src" / "hydra_plugins" / "mynet" / "subprocess_launcher.py").is_file()
    leftovers = [
        p
        for p in copy.rglob("*")
        if p.is_file() and ".git" not in p.parts and "litforge" in p.read_text(errors="ignore")
    ]
    assert leftovers == []

    data_dir = write_idx_dataset(
        tmp_path / "data" / "MNIST" / "raw", n_train=200, n_test=50
    ).parents[1]
    run = run_script(
        "train.py",
        "debug=fdr",
        "data=mnist",
        "data.val_size=50",
        f"paths.data_dir={data_dir}",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=copy,
        env={"PYTHONPATH": str(copy / "src")},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "mynet.models.mlp.MLP" in (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
