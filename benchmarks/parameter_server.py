"""Training throughput (samples per second, all workers together) of DDP and of
`strategy=parameter_server` in sync and async mode, with and without a straggler: one worker
slowed on purpose by a delay after each of its steps. Needs Fashion-MNIST (`make data`).

    python benchmarks/parameter_server.py                  # 2 workers, 20 ms straggler delay
    python benchmarks/parameter_server.py --workers 3 --delay-ms 50

Workload: the default MLP on Fashion-MNIST, batch 128 per worker, CPU processes; DDP runs the
workers alone, the parameter server one server more. Each run is `python train.py` for 2 epochs;
the second is timed (from its first batch to the last worker's last batch), the first warms up.
Async mode's epoch ends when the servers have taken one epoch's pushes from all workers
together, so a fast worker's share grows; in sync mode and DDP every step waits for the slowest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L

ROOT = Path(__file__).resolve().parents[1]


class SlowWorker(L.Callback):
    """The straggler: worker `rank` sleeps `delay_ms` after each training step."""

    def __init__(self, rank: int, delay_ms: float) -> None:
        self.rank, self.delay = rank, delay_ms / 1000

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank:
            time.sleep(self.delay)


class Throughput(L.Callback):
    """Each worker's samples and first/last batch times in epoch `epoch`, as `rank<N>.json`."""

    def __init__(self, path: str, epoch: int = 1) -> None:
        self.path, self.epoch = Path(path), epoch
        self.samples, self.start, self.end = 0, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and self.start is None:
            self.start = time.time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch:
            self.samples += len(batch[1])
            self.end = time.time()

    def on_train_end(self, trainer, pl_module) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        record = {"samples": self.samples, "start": self.start, "end": self.end}
        (self.path / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def samples_per_second(strategy: list[str], workers: int, delay_ms: float, port: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        records = Path(tmp) / "records"
        command = [
            sys.executable,
            "train.py",
            *strategy,
            "trainer.accelerator=cpu",
            "trainer.max_epochs=2",
            "trainer.limit_val_batches=5",
            "test=false",
            "data.batch_size=128",
            "data.download=false",
            "logger=none",
            "callbacks.rich_progress_bar=null",
            "extras.print_config=false",
            f"hydra.run.dir={tmp}/run",
            "+callbacks.throughput._target_=parameter_server.Throughput",
            f"+callbacks.throughput.path={records}",
        ]
        if delay_ms:
            command += [
                "+callbacks.slow._target_=parameter_server.SlowWorker",
                f"+callbacks.slow.rank={workers - 1}",
                f"+callbacks.slow.delay_ms={delay_ms}",
            ]
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "benchmarks"),
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",  # one core's worth per process: no oversubscription
        }
        subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
        rows = [json.loads(p.read_text()) for p in records.glob("rank*.json")]
    assert len(rows) == workers, rows
    seconds = max(r["end"] for r in rows) - min(r["start"] for r in rows)
    return sum(r["samples"] for r in rows) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the straggler's, per step")
    args = parser.parse_args()
    w = args.workers
    setups = {
        "ddp": ["strategy=ddp", f"trainer.devices={w}"],
        "parameter server, sync": ["strategy=parameter_server", f"trainer.devices={w + 1}"],
        "parameter server, async": [
            "strategy=parameter_server",
            "strategy.mode=async",
            f"trainer.devices={w + 1}",
        ],
    }
    print(
        f"Fashion-MNIST, default MLP, batch 128 per worker, {w} workers, CPU; straggler: worker "
        f"rank {w - 1}, +{args.delay_ms:g} ms per step",
        flush=True,
    )
    print(
        "| setup | samples/s | with the straggler | ratio | the straggler's pace | "
        "the other workers alone |"
    )
    print("|---|---|---|---|---|---|")
    port = 29400 + os.getpid() % 1000
    for name, strategy in setups.items():
        plain = samples_per_second(strategy, w, 0, port)
        slowed = samples_per_second(strategy, w, args.delay_ms, port + 1)
        # All workers at the straggler's pace: each step `delay` longer than without it.
        step = w * 128 / plain
        pace = w * 128 / (step + args.delay_ms / 1000)
        others = plain * (w - 1) / w  # the others' share of the throughput without it
        print(
            f"| {name} | {plain:.0f} | {slowed:.0f} | {slowed / plain:.2f} | {pace:.0f} | "
            f"{others:.0f} ({slowed / others:.0%} of it kept) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
