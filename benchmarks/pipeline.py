"""Time per training step under pipeline parallelism, against the microbatch count, next to the
idle share ("bubble") the schedule predicts: (p - 1) / (m + p - 1) for p stages, m microbatches.

Workload: `train.py` on Fashion-MNIST, MLP with hidden sizes [512, 512, 512] (4 blocks: up to 4
stages), batch 256, `--steps` training steps (the first 5 not timed), no validation; one process
(`strategy=auto`) as the reference, then `strategy=model_parallel` with 2 and 4 stages (GPipe and
1F1B) and each microbatch count. Each stage is a process: with more processes than cores (4
stages on this 2-core machine) they take turns, and the times say so.

    python benchmarks/pipeline.py
    python benchmarks/pipeline.py --stages 2 --microbatches 2 4 8 --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 5


class StepTimer(L.Callback):
    """Median seconds between the ends of training steps (after WARMUP), written by rank 0."""

    def __init__(self, path: str) -> None:
        self.path, self.ends = Path(path), []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.ends.append(time.perf_counter())

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            ends = self.ends[WARMUP:]
            steps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
            self.path.write_text(json.dumps(statistics.median(steps)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seconds_per_step(out: Path, steps: int, *overrides: str) -> float:
    result = out / "step.json"
    command = [
        sys.executable, "train.py", "model.net.hidden_sizes=[512,512,512]", "model.net.dropout=0",
        "data.batch_size=256", "trainer.max_epochs=1", f"trainer.limit_train_batches={steps}",
        "trainer.limit_val_batches=0", "test=false", "optimized_metric=null", "logger=none",
        "callbacks=none",
        "extras.print_config=false", f"hydra.run.dir={out / 'run'}",
        "+callbacks.timer._target_=pipeline.StepTimer", f"+callbacks.timer.path={result}",
        *overrides,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks"), "MASTER_PORT": str(free_port())}
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
    return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d')}; {args.steps} steps of batch 256")
    with tempfile.TemporaryDirectory() as tmp:
        one = seconds_per_step(Path(tmp) / "one", args.steps)
        print(f"one process: {one * 1000:.1f} ms/step\n")
        header = ("stages", "schedule", "micro", "ms/step", "x one", "bubble")
        print("{:>6} {:>9} {:>5} {:>8} {:>6} {:>7}".format(*header))
        for p in args.stages:
            for schedule in args.schedules:
                for m in args.microbatches:
                    if m < p and schedule == "1f1b":
                        continue  # torch's 1F1B wants at least one microbatch per stage
                    seconds = seconds_per_step(
                        Path(tmp) / f"p{p}_{schedule}_m{m}",
                        args.steps,
                        "strategy=model_parallel",
                        f"trainer.devices={p}",
                        f"strategy.pipeline_parallel_size={p}",
                        f"strategy.schedule={schedule}",
                        f"strategy.microbatches={m}",
                    )
                    bubble = (p - 1) / (m + p - 1)
                    print(
                        f"{p:>6} {schedule:>9} {m:>5} {seconds * 1000:>8.1f} "
                        f"{seconds / one:>6.2f} {bubble:>7.0%}"
                    )


if __name__ == "__main__":
    main()
