"""The summary of a sweep (`-m`): one row per job — what it varied, how it ended, its final
metrics, its folder — plus mean ± std rows for jobs that differ only by `seed` or by `data.fold`
(k-fold cross-validation: `data.num_folds=5 data.fold=0,1,2,3,4`). Written into the
sweep folder as `summary.csv`, `summary.md` and `plots/sweep.png` after each job.

`SweepSummary` is the Hydra callback (conf/hydra/default.yaml) that collects the jobs, prints the
summary when the sweep ends and, when a job failed, lists the failures and exits with status 1:
any entry point gets that, with litforge's launcher (the default) or Hydra's basic one. (A
launcher that runs the jobs elsewhere, such as submitit, calls their callbacks there: no summary.)
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from litforge.sweeps import JobFailed


@dataclass
class JobResult:
    num: int
    overrides: list[str]
    run_dir: Path
    status: str  # "completed" or "failed"
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""


def _varying(jobs: list[JobResult]) -> dict[int, str]:
    """Each job's overrides, leaving out those every job shares."""
    shared = set.intersection(*(set(job.overrides) for job in jobs)) if len(jobs) > 1 else set()
    return {job.num: " ".join(o for o in job.overrides if o not in shared) for job in jobs}


REPEATS = {"seed": "seeds", "data.fold": "folds"}  # what a mean ± std row averages over
_REPEATED = "|".join(map(re.escape, REPEATS))


def _without_repeats(overrides: str) -> str:
    return re.sub(rf"(^| )({_REPEATED})=\S+", "", overrides).strip()


def rows(jobs: list[JobResult], metric: str | None, mode: str = "max") -> list[dict[str, str]]:
    varying = _varying(jobs)
    metric_names = sorted({name for job in jobs for name in job.metrics})

    def sort_key(job: JobResult) -> tuple[int, float]:
        value = job.metrics.get(metric, math.nan) if metric else math.nan
        if math.isnan(value):
            return (1, 0.0)  # failed and unscored jobs last
        return (0, -value if mode == "max" else value)

    table = []
    for job in sorted(jobs, key=sort_key):
        row = {"job": str(job.num), "overrides": varying[job.num], "status": job.status}
        row |= {
            name: f"{job.metrics[name]:.4f}" if name in job.metrics else "" for name in metric_names
        }
        row |= {"run_dir": str(job.run_dir), "error": job.error}
        table.append(row)

    groups: dict[str, list[JobResult]] = {}
    for job in jobs:
        if job.status == "completed" and _without_repeats(varying[job.num]) != varying[job.num]:
            groups.setdefault(_without_repeats(varying[job.num]), []).append(job)
    for key, members in groups.items():
        if len(members) < 2:
            continue
        repeated = [
            name
            for option, name in REPEATS.items()
            if re.search(rf"(^| ){re.escape(option)}=", varying[members[0].num])
        ]
        row = {
            "job": "mean ± std",
            "overrides": f"{key} ({len(members)} {' × '.join(repeated)})".strip(),
            "status": "completed",
        }
        for name in metric_names:
            values = [job.metrics[name] for job in members if name in job.metrics]
            row[name] = (
                f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"
                if len(values) > 1
                else ""
            )
        row |= {"run_dir": "", "error": ""}
        table.append(row)
    return table


def write(
    sweep_dir: Path, jobs: list[JobResult], metric: str | None, mode: str = "max", show=False
) -> None:
    """The summary files; `show`: print the decisive columns too."""
    table = rows(jobs, metric, mode)
    columns = list(table[0])
    with (sweep_dir / "summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(table)
    (sweep_dir / "summary.md").write_text(_markdown(table, columns))

    if metric and any(metric in job.metrics for job in jobs):
        _plot(jobs, metric, sweep_dir / "plots" / "sweep.png")

    if show:  # the columns that decide; the files have them all
        shown = ["job", "overrides", "status", metric, "test/acc", "error"]
        print(f"Sweep summary ({sweep_dir / 'summary.md'}):")
        print(_markdown(table, [c for c in dict.fromkeys(shown) if c in columns]), end="")


def _plot(jobs: list[JobResult], metric: str, path: Path) -> None:
    """The optimized metric of each job that has one (not NaN), first job on top."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    varying = _varying(jobs)
    scored = [job for job in jobs if not math.isnan(job.metrics.get(metric, math.nan))][::-1]
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.4 * len(scored)), dpi=100)
    ax.barh(
        [f"#{job.num} {varying[job.num]}" for job in scored],
        [job.metrics[metric] for job in scored],
    )
    ax.set(xlabel=metric, title=f"{metric} per job")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _markdown(table: list[dict[str, str]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += [
        "| " + " | ".join(row[c].replace("|", "\\|") for c in columns) + " |" for row in table
    ]
    return "\n".join(lines) + "\n"


class SweepSummary(Callback):
    """Collect each job of a sweep as it ends, rewrite the summary, and at the end of the sweep
    print it and exit with status 1 if a job failed.

    A sweeper whose class sets `writes_own_summary = True` (the Optuna sweeper, which summarizes
    all trials of its study and judges failed trials itself) is left alone.
    """

    def __init__(self) -> None:
        self.jobs: list[JobResult] = []

    @staticmethod
    def _active(config: DictConfig) -> bool:
        if config.hydra.mode != RunMode.MULTIRUN:  # a single run, sweep job or not
            return False
        sweeper = OmegaConf.select(config, "hydra.sweeper._target_")
        return not (sweeper and getattr(get_class(sweeper), "writes_own_summary", False))

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not self._active(config):
            return
        run_dir = Path(config.hydra.runtime.output_dir)  # working_dir is the cwd (chdir=false)
        failed = job_return.status == JobStatus.FAILED or isinstance(
            job_return._return_value, JobFailed
        )
        metrics_file = run_dir / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
        self.jobs.append(
            JobResult(
                config.hydra.job.num,
                list(job_return.overrides or []),
                run_dir,
                "failed" if failed else "completed",
                {} if failed else metrics,
                (str(job_return._return_value).strip().splitlines() or [""])[0] if failed else "",
            )
        )
        self._write(config, show=False)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not (self._active(config) and self.jobs):
            return
        self._write(config, show=True)
        failed = [job for job in self.jobs if job.status == "failed"]
        if failed:
            print(f"error: {len(failed)} job(s) of the sweep failed:", file=sys.stderr)
            for job in failed:
                print(f"  #{job.num} ({' '.join(job.overrides)}): {job.error}", file=sys.stderr)
            sys.exit(1)

    def _write(self, config: DictConfig, show: bool) -> None:
        metric = OmegaConf.select(config, "optimized_metric")
        mode = OmegaConf.select(config, "optimized_metric_mode", default="max")
        write(Path(config.hydra.sweep.dir), self.jobs, metric, mode, show=show)
