"""`hparams_search=optuna`: our Optuna sweeper plugin (hydra_plugins/litforge/optuna_sweeper.py)
searches, stores the study in SQLite, resumes it, records failed and pruned trials."""

import csv

import optuna
import pytest
import torch
import yaml
from helpers import run_script, tiny_run_args
from hydra.core.override_parser.overrides_parser import OverridesParser
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from hydra_plugins.litforge.optuna_sweeper import _distribution


def distribution(line: str):
    return _distribution(OverridesParser.create().parse_override(line))


def test_search_space_syntax_maps_to_optuna_distributions():
    assert distribution("lr=interval(0.001, 0.1)") == FloatDistribution(0.001, 0.1)
    assert distribution("lr=tag(log, interval(1e-4, 1e-2))") == FloatDistribution(
        1e-4, 1e-2, log=True
    )
    assert distribution("epochs=int(interval(2, 8))") == IntDistribution(2, 8)
    # Hydra's range excludes its end: 64..512 in steps of 64
    assert distribution("batch=range(64, 513, 64)") == IntDistribution(64, 512, step=64)
    assert distribution("model=choice(mlp, cnn)") == CategoricalDistribution(["mlp", "cnn"])
    # Optuna stores plain values only: lists go in as their override text
    assert distribution("sizes=choice([256], [512, 256])") == CategoricalDistribution(
        ["[256]", "[512,256]"]
    )


def open_study(sweep_dir, name="mnist_mlp"):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{sweep_dir / 'optuna.db'}")


def search(data_dir, sweep_dir, *extra):
    """`python train.py -m hparams_search=optuna` on the small MNIST files, seconds a trial."""
    args = [
        "-m",
        "hparams_search=optuna",
        *tiny_run_args(data_dir, None),
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        "logger=none",
        f"hydra.sweep.dir={sweep_dir}",
        *extra,
    ]
    return run_script("train.py", *args, timeout=600)


def summary_rows(sweep_dir) -> list[dict[str, str]]:
    with (sweep_dir / "summary.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_search_runs_trials_and_resumes_the_same_study(tmp_path, idx_data_dir):
    sweep_dir = tmp_path / "search"
    first = search(idx_data_dir, sweep_dir, "hydra.sweeper.n_trials=2")
    assert first.returncode == 0, first.stderr[-3000:]
    study = open_study(sweep_dir)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    first_params = [t.params for t in study.trials]

    # The same command with a larger n_trials: the stored trials stay, one more runs.
    again = search(idx_data_dir, sweep_dir, "hydra.sweeper.n_trials=3")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 finished trial(s), 1 to run" in again.stdout + again.stderr
    study = open_study(sweep_dir)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert [t.params for t in study.trials[:2]] == first_params
    assert {p.name for p in sweep_dir.iterdir()} >= {"0", "1", "2", "optuna.db", "summary.md"}

    rows = summary_rows(sweep_dir)
    assert sorted(row["job"] for row in rows) == ["0", "1", "2"]  # all, not just the last run
    assert [float(row["val/acc_best"]) for row in rows] == pytest.approx(
        sorted((t.value for t in study.trials), reverse=True), abs=1e-4
    )
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    assert best["best_trial"] == study.best_trial.number
    assert best["best_params"] == study.best_params
    assert "model.optimizer.lr=" in " ".join(best["overrides"])


@pytest.mark.slow
def test_failed_trials_are_recorded_and_the_search_goes_on(tmp_path, idx_data_dir):
    sweep_dir = tmp_path / "search"
    result = search(
        idx_data_dir,
        sweep_dir,
        "hydra.sweeper.n_trials=2",
        "data.val_size=choice(100000)",  # more than the training set: every trial fails
    )
    assert result.returncode == 1
    assert "no trial of Optuna study 'mnist_mlp' completed" in result.stderr
    study = open_study(sweep_dir)
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 2  # both ran
    rows = summary_rows(sweep_dir)
    assert [row["status"] for row in rows] == ["failed", "failed"]
    assert all("val_size" in row["error"] for row in rows)


@pytest.mark.slow
def test_pruner_stops_a_trial_early(tmp_path, idx_data_dir):
    sweep_dir = tmp_path / "search"
    result = search(
        idx_data_dir,
        sweep_dir,
        "hydra.sweeper.n_trials=1",
        "trainer.max_epochs=3",
        # prunes any trial whose val/acc_best is below 1.1: all of them, after epoch 0
        "hydra.sweeper.pruner={_target_:optuna.pruners.ThresholdPruner,lower:1.1}",
    )
    assert result.returncode == 1  # no trial completed
    assert "Optuna pruned trial 0 after epoch 0." in result.stdout
    [trial] = open_study(sweep_dir).trials
    assert trial.state == TrialState.PRUNED
    assert list(trial.intermediate_values) == [0]
    last = torch.load(sweep_dir / "0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["epoch"] == 0  # training stopped after the first of 3 epochs
