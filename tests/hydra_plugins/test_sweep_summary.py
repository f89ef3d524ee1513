"""`hydra_plugins.litforge.sweep_summary`: ranking, what varied, and mean ± std over seeds and
cross-validation folds."""

import math
from pathlib import Path

from hydra_plugins.litforge.sweep_summary import JobResult, rows, write


def job(num, overrides, value=None, status="completed"):
    metrics = {} if value is None else {"val/loss": value, "test/acc": 1 - value}
    return JobResult(num, overrides, Path(f"/s/{num}"), status, metrics)


def test_ranks_by_the_optimized_metric_in_its_direction_failed_last():
    jobs = [
        job(0, ["a=1", "lr=1"], 0.5),
        job(1, ["a=1", "lr=2"], status="failed"),
        job(2, ["a=1", "lr=3"], 0.2),
    ]
    table = rows(jobs, "val/loss", mode="min")
    assert [r["job"] for r in table] == ["2", "0", "1"]
    assert [r["overrides"] for r in table] == ["lr=3", "lr=1", "lr=2"]  # shared a=1 left out
    assert [r["job"] for r in rows(jobs, "val/loss", mode="max")] == ["0", "2", "1"]


def test_seed_groups_get_mean_and_sample_std():
    jobs = [
        job(0, ["seed=0", "lr=1"], 0.2),
        job(1, ["seed=1", "lr=1"], 0.4),
        job(2, ["seed=0", "lr=2"], 0.3),
    ]
    table = rows(jobs, "val/loss", mode="min")
    (mean,) = [r for r in table if r["job"] == "mean ± std"]
    assert mean["overrides"] == "lr=1 (2 seeds)"
    assert mean["val/loss"] == f"0.3000 ± {math.sqrt(0.02):.4f}"


def test_the_folds_of_a_cross_validation_get_mean_and_std():
    # python train.py -m data.num_folds=3 data.fold=0,1,2 model.optimizer.lr=1,2
    jobs = [
        job(i, ["data.num_folds=3", f"data.fold={i % 3}", f"lr={1 + i // 3}"], 0.1 * (i + 1))
        for i in range(6)
    ]
    means = {
        r["overrides"]: r["val/loss"] for r in rows(jobs, "val/loss") if r["job"] == "mean ± std"
    }
    assert means == {"lr=1 (3 folds)": "0.2000 ± 0.1000", "lr=2 (3 folds)": "0.5000 ± 0.1000"}
    # seeds and folds at once: one row per setting, over both
    jobs = [job(i, [f"seed={i // 2}", f"data.fold={i % 2}"], 0.1 * i) for i in range(4)]
    (mean,) = [r for r in rows(jobs, "val/loss") if r["job"] == "mean ± std"]
    assert mean["overrides"] == "(4 seeds × folds)"


def test_files_are_written_and_the_figure_freed(tmp_path):
    import matplotlib.pyplot as plt

    write(tmp_path, [job(0, ["lr=1"], 0.5)], "val/loss", "min")
    assert (tmp_path / "plots" / "sweep.png").read_bytes().startswith(b"\x89PNG")
    assert plt.get_fignums() == []  # an Optuna search writes this after every trial
    assert (tmp_path / "summary.csv").read_text().splitlines()[0].startswith("job,overrides,status")
    assert "| 0 | lr=1 | completed |" in (tmp_path / "summary.md").read_text()
