"""What a run prints: each line once, a short config summary rather than the whole tree, no
adverts or empty figures from Lightning, a progress bar whose numbers belong together; and what
a run stopped by a mistake in its input leaves behind (no empty run folder)."""

import json
import re

import pytest
from helpers import go_offline, run_in_process, run_script, write_idx_dataset

ARGS = [
    "data=mnist",
    "data.val_size=100",
    "data.batch_size=64",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=5",  # fewer than log_every_n_steps (50)
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
]


@pytest.fixture(scope="module")
def console_run(tmp_path_factory):
    """A 2-epoch run as a user starts it (its own interpreter: Lightning puts its console
    handler on the stderr the process starts with); its output and its run folder."""
    tmp = tmp_path_factory.mktemp("console")
    write_idx_dataset(tmp / "data" / "MNIST" / "raw")
    run_dir = tmp / "run"
    result = run_script(
        "train.py",
        *ARGS,
        f"paths.data_dir={tmp / 'data'}",
        f"hydra.run.dir={run_dir}",
        env={"COLUMNS": "300"},  # the progress bar's metrics on one line
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr, run_dir


@pytest.mark.slow  # (console_run: a subprocess)
def test_lightning_lines_are_printed_once_and_logged(console_run):
    output, run_dir = console_run
    log = (run_dir / "train.log").read_text()
    for line in ("Seed set to 42", "GPU available: False", "`Trainer.fit` stopped"):
        assert output.count(line) == 1, line
        assert log.count(line) == 1, line


@pytest.mark.slow  # (console_run: a subprocess)
def test_console_gets_a_summary_and_the_tree_goes_to_its_file(console_run):
    output, run_dir = console_run
    assert "Config: data=mnist model=mlp strategy=auto trainer=default" in output
    assert "Overrides: data=mnist data.val_size=100 data.batch_size=64" in output
    assert f"Full config: {run_dir / 'config_tree.log'}" in output
    assert "_target_" not in output and "├──" not in output
    tree = (run_dir / "config_tree.log").read_text()
    assert "_target_: litforge.models.ClassificationModule" in tree
    assert "├── data" in tree and "batch_size: 64" in tree


@pytest.mark.slow  # (console_run: a subprocess)
def test_no_lightning_adverts(console_run):
    output, _ = console_run
    assert "Tip:" not in output and "litlogger" not in output


@pytest.mark.slow  # (console_run: a subprocess)
def test_the_model_summary_is_printed(console_run):
    output, _ = console_run
    assert "Trainable params" in output


@pytest.mark.slow  # (console_run: a subprocess)
def test_progress_bars_show_a_measured_speed(console_run):
    # The bars left on the screen, the last epoch's and the test's: done, timed, then the speed
    # they were measured at (Lightning's own column would show 0.00it/s for a finished bar).
    output, _ = console_run
    bar = r"━+ (\d+)/\1 \d+:\d\d:\d\d • \d+:\d\d:\d\d (\d+\.\d\d)it/s"
    for name in ("Epoch 1/1", "Testing"):
        [line] = [line for line in output.splitlines() if line.startswith(name)]
        shown = re.search(bar, line)
        assert shown, line
        assert float(shown[2]) > 0, line


@pytest.mark.slow  # (console_run: a subprocess)
def test_no_warning_about_epochs_shorter_than_the_logging_interval(console_run):
    # Step logs are written every log_every_n_steps steps counted across epochs: nothing lost.
    output, _ = console_run
    assert "log_every_n_steps" not in output
    assert "LeafSpec" not in output  # (Lightning 2.6.6 on torch >= 2.10: its own deprecation)


@pytest.mark.slow  # (console_run: a subprocess)
def test_progress_bar_shows_the_step_loss_and_the_epochs_validation(console_run):
    # Lightning's bar as its users know it: the step's loss, this epoch's validation metrics.
    output, run_dir = console_run
    [bar] = [line for line in output.splitlines() if line.startswith("Epoch 1/1")]
    final = json.loads((run_dir / "metrics.json").read_text())
    shown = {name: float(value) for name, value in re.findall(r"(\S+): ([\d.]+)", bar)}
    assert "train/loss_step" in shown
    assert shown["val/loss"] == pytest.approx(final["val/loss"], abs=1e-3)


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_a_config_mistake_leaves_no_run_folder(tmp_path, script):
    run_dir = tmp_path / "runs" / "run"
    args = ["seed=abc", f"hydra.run.dir={run_dir}"]
    result = run_in_process(script, *args, *(["ckpt_path=x.ckpt"] if script == "eval.py" else []))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: seed=abc: must be an integer")
    assert "Config:" not in result.stdout, "checks come before the summary"
    assert not run_dir.exists()
    assert (tmp_path / "runs").is_dir(), "only the run's own folder goes"


def test_a_data_mistake_leaves_no_run_folder(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    go_offline(monkeypatch)
    result = run_in_process(
        "train.py",
        "data=mnist",
        f"paths.data_dir={tmp_path / 'data'}",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 1 and "error: mnist not found" in result.stderr
    assert not run_dir.exists()


def test_with_hydra_full_error_the_folder_and_its_log_stay(tmp_path):
    run_dir = tmp_path / "run"
    result = run_in_process(
        "train.py", "data.batch_size=0", f"hydra.run.dir={run_dir}", env={"HYDRA_FULL_ERROR": "1"}
    )
    assert result.returncode == 1 and "Traceback" in result.stderr
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "train.log").is_file()


@pytest.mark.parametrize("earlier", ["checkpoints/last.ckpt", "train.log"])
def test_a_folder_a_run_goes_back_into_stays(tmp_path, earlier):
    # A resumed run's folder (as `ckpt_path=last` finds it): its checkpoints, or the log of an
    # earlier attempt, are not this run's to remove.
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / earlier).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / earlier).write_text("from an earlier run\n")
    result = run_in_process("train.py", "data.batch_size=0", f"hydra.run.dir={run_dir}")
    assert result.returncode == 1
    assert (run_dir / earlier).read_text().startswith("from an earlier run\n")
