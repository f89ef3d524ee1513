"""A Hydra launcher that runs every job of a sweep (`-m`) in a fresh process.

Hydra's default launcher runs the jobs one after another inside the sweeping process. Under DDP
that breaks (Lightning #18175, Hydra #2070): processes re-run the whole sweep, and the process
group, ranks and ports of one job leak into the next. Here each job is
`python train.py <its overrides> hydra.run.dir=<its sweep subdir>`: a single run in its own
process, so whatever its strategy does starts from nothing and ends with the process. Its
result (the config's `optimized_metric`, for sweepers) is read back from `metrics.json`.

After each batch of jobs it writes the sweep's summary (`litforge.sweep_summary`). Selected in
conf/hydra/default.yaml (`hydra/launcher: subprocess`).
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
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from litforge import errors, sweep_summary

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
        self.results: list[sweep_summary.JobResult] = []  # over all batches of the sweep
        self.write_summary = True  # a sweeper that writes its own summary turns this off

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context, self.config = hydra_context, config

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
        env["LITFORGE_SWEEP"] = sweep_dir.name  # groups the jobs in trackers (wandb group)
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
            command = [
                sys.executable,
                sys.argv[0],
                f"--config-name={job_cfg.hydra.job.config_name}",
                *overrides,
                *hydra_overrides,
                f"hydra.run.dir={run_dir}",
            ]
            code, error = self._run(command, env)
            returns.append(self._job_return(job_cfg, list(overrides), run_dir, code, error))
        if self.write_summary:
            metric = OmegaConf.select(self.config, "optimized_metric")
            mode = OmegaConf.select(self.config, "optimized_metric_mode", default="max")
            sweep_summary.write(sweep_dir, self.results, metric, mode)
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

    def _job_return(
        self, cfg: DictConfig, overrides: list[str], run_dir: Path, code: int, error: str
    ) -> JobReturn:
        result = JobReturn(
            overrides=overrides,
            cfg=cfg,
            hydra_cfg=cfg,
            working_dir=str(run_dir),
            task_name=cfg.hydra.job.name,
            status=JobStatus.COMPLETED,
        )
        if code != 0:
            # Reported here, once; the other jobs go on, and train.py exits 1 at the end. (A
            # FAILED status would make Hydra's sweeper stop with a traceback after this batch.)
            message = (
                f"job #{cfg.hydra.job.num} ({' '.join(overrides)}) exited with status {code}; "
                f"its log is in {run_dir}"
            )
            log.error(message)
            errors.failed_sweep_jobs.append(message)
            self.results.append(
                sweep_summary.JobResult(
                    cfg.hydra.job.num, overrides, run_dir, "failed", error=error or message
                )
            )
            return result
        metrics_file = run_dir / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
        self.results.append(
            sweep_summary.JobResult(cfg.hydra.job.num, overrides, run_dir, "completed", metrics)
        )
        metric = OmegaConf.select(cfg, "optimized_metric")
        if metric:
            result._return_value = metrics.get(metric)
        return result
