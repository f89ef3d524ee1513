"""Bad input ends a run with one clear message and a non-zero exit, not a traceback."""

import pytest
from helpers import offline_env, run_script


@pytest.mark.slow
def test_missing_dataset_offline_is_one_message_without_traceback(tmp_path):
    data_dir, run_dir = tmp_path / "data", tmp_path / "run"
    args = [
        "data=mnist",
        f"paths.data_dir={data_dir}",
        f"data.system_dir={tmp_path / 'sys'}",
        f"hydra.run.dir={run_dir}",
    ]
    result = run_script("train.py", *args, env=offline_env(tmp_path))

    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error_lines == [
        "error: dataset 'mnist' not found. Looked for "
        "train-images-idx3-ubyte, train-labels-idx1-ubyte, "
        "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte in:"
    ]
    assert f"  - {data_dir / 'mnist'}" in result.stderr
    assert "network disabled by the test" in result.stderr
    assert "python -m litforge.data fetch mnist" in result.stderr
    # nothing half-written: no data folder, no checkpoints, no logger output
    assert not data_dir.exists()
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "csv").exists()

    full = run_script("train.py", *args, env={**offline_env(tmp_path), "HYDRA_FULL_ERROR": "1"})
    assert full.returncode == 1 and "Traceback" in full.stderr


@pytest.mark.slow
def test_eval_without_checkpoint_says_what_to_add(tmp_path):
    result = run_script("eval.py", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("error: no checkpoint given: add ckpt_path=")
    )


@pytest.mark.slow
def test_unknown_config_option_lists_the_choices(tmp_path):
    result = run_script("train.py", "model=transformer", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1
    assert "Could not find 'model/transformer'" in result.stderr and "mlp" in result.stderr
