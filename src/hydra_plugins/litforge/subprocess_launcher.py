"""A Hydra launcher that runs every job of a sweep (`-m`) in a fresh process.

Hydra's default launcher runs the jobs one after another inside the sweeping process. Under DDP
that breaks (Lightning #18175, Hydra #2070): processes re-run the whole sweep, and the process
group, ranks and ports of one job leak into the next. Here each job is
`python train.py <its overrides> hydra.run.dir=<its sweep subdir>`: a single run in its own
process, so whatever its strategy does starts from nothing and ends with the process. Its
result (the config's `optimized_metric`, for sweepers) is read back from `metrics.json`.

Each job's start and end go to Hydra's callbacks in this process (the sweep summary among them),
as Hydra's own launchers do; the job's process runs them too, as a single run's. Selected in
conf/hydra/default.yaml (`hydra/launcher: subprocess`).

A job is told that it is one (it runs as a single run) by one more override before the sweep's:
`++sweep_name=<the sweep folder's name>`, in its `.hydra/overrides.yaml`. A logger's config may
group a sweep's jobs by it (`${oc.select:sweep_name,null}`), and a failed job keeps its folder
for the sweep summary (`litforge.errors`). A `sweep_name=...` of the user's, after it, wins.
"""

import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.types import Quote, QuotedString
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from litforge.sweeps import JobFailed

log = logging.getLogger(__name__)

# What a job must not inherit from the sweeping process: it elects its own ranks and port.
DISTRIBUTED_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PL_GLOBAL_SEED",
)
# Hydra settings of the sweep itself, which a single run must not get.
SWEEP_ONLY = (
    "hydra.sweep",
    "hydra.mode",
    "hydra/sweeper",
    "hydra.sweeper",
    "hydra/launcher",
    "hydra.launcher",
)


@dataclass
class SubprocessLauncherConf:
    _target_: str = "hydra_plugins.litforge.subprocess_launcher.SubprocessLauncher"


ConfigStore.instance().store(
    group="hydra/launcher", name="subprocess", node=SubprocessLauncherConf, provider="litforge"
)


class SubprocessLauncher(Launcher):
    def __init__(self) -> None:
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.task_function = task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs, each in its own process, into {sweep_dir}")
        hydra_overrides = [
            o for o in self.config.hydra.overrides.hydra if not o.startswith(SWEEP_ONLY)
        ]
        env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
        name = QuotedString(text=sweep_dir.name, quote=Quote.single).with_quotes()
        returns = []
        for num, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{num} : {' '.join(filter_overrides(overrides))}")
            job_cfg = self.hydra_context.config_loader.load_sweep_config(
                self.config, list(overrides)
            )
            with open_dict(job_cfg):
                job_cfg.hydra.job.id = f"{job_cfg.hydra.job.name}_{num}"
                job_cfg.hydra.job.num = num
                run_dir = Path(job_cfg.hydra.sweep.dir) / str(job_cfg.hydra.sweep.subdir)
                job_cfg.hydra.runtime.output_dir = str(run_dir)
            callbacks = self.hydra_context.callbacks
            callbacks.on_job_start(config=job_cfg, task_function=self.task_function)
            command = [
                sys.executable,
                sys.argv[0],
                f"--config-name={job_cfg.hydra.job.config_name}",
                f"++sweep_name={name}",  # a job of this sweep (see the module's docstring)
                *overrides,
                *hydra_overrides,
                f"hydra.run.dir={run_dir}",
            ]
            code, error = self._run(command, env)
            result = self._job_return(job_cfg, list(overrides), run_dir, code, error)
            callbacks.on_job_end(config=job_cfg, job_return=result)
            returns.append(result)
        return returns

    @staticmethod
    def _run(command: list[str], env: dict[str, str]) -> tuple[int, str]:
        """Run a job; its output goes to ours as it comes. Returns its exit status and the last
        `error:` line it printed (our entry points' one-line errors)."""
        error = ""
        with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) as process:
            assert process.stderr is not None
            for line in process.stderr:
                sys.stderr.write(line)
                if line.startswith("error:"):
                    error = line[len("error:") :].strip()
        return process.returncode, error

    @staticmethod
    def _job_return(
        cfg: DictConfig, overrides: list[str], run_dir: Path, code: int, error: str
    ) -> JobReturn:
        """A failed job is COMPLETED with a `JobFailed` value: Hydra's BasicSweeper raises the
        error of a FAILED job after its batch and ends the sweep there, where the others should
        go on and the failures be listed at the end (`sweep_summary.SweepSummary`)."""
        result = JobReturn(
            overrides=overrides,
            cfg=cfg,
            hydra_cfg=cfg,
            working_dir=str(run_dir),
            task_name=cfg.hydra.job.name,
            status=JobStatus.COMPLETED,
        )
        if code != 0:
            log.error(f"job #{cfg.hydra.job.num} ({' '.join(overrides)}) exited with status {code}")
            result.return_value = JobFailed(
                error or f"exited with status {code}; its log is in {run_dir}"
            )
            return result
        metrics_file = run_dir / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
        metric = OmegaConf.select(cfg, "optimized_metric")
        result.return_value = metrics.get(metric) if metric else None
        return result
