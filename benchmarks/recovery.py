"""Recovery time under torchrun: from the moment a worker is lost to the first training step of
the restarted job, and whether the job then ends where an uninterrupted one does.

Workload: `torchrun --nproc-per-node=2 --max-restarts=1 train.py strategy=ddp
trainer.accelerator=cpu trainer.devices=2 trainer.max_epochs=4 trainer.deterministic=true` on
Fashion-MNIST (MLP, batch 256, 55k training images per epoch), c10d rendezvous on localhost. After
the checkpoint of the second epoch (epoch 1), the worker of rank 1 is

- `kill`: killed with SIGKILL (a crash, the out-of-memory killer);
- `stop`: stopped with SIGSTOP (a hung process: alive, never answering), with
  `strategy.timeout` of `--stop-timeout` seconds.

Printed per case: seconds from the fault to torchrun's report of a failed worker, to the restarted
workers' "Resuming from" line, and to their first training step; the resumed run's final test
accuracy next to the uninterrupted run's.

    python benchmarks/recovery.py                 # both cases and the uninterrupted reference
    python benchmarks/recovery.py --cases kill --epochs 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import lightning as L

ROOT = Path(__file__).resolve().parents[1]
FIRST_STEP = "recovery benchmark: first step"


class FirstStepTime(L.Callback):
    """Prints the wall-clock time of each process's first training step (it is also the first
    step after a resume)."""

    def __init__(self) -> None:
        self.done = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.done:
            self.done = True
            print(f"{FIRST_STEP} {trainer.global_step} at {time.time():.3f}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_pid(agent: subprocess.Popen, local_rank: int) -> int:
    """The pid of torchrun's worker process of `local_rank`."""
    children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
    for child in children:
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"LOCAL_RANK={local_rank}".encode() in environ:
            return int(child)
    raise RuntimeError(f"no worker of local rank {local_rank} among {children}")


def run(out: Path, epochs: int, fault: str | None, stop_timeout: int) -> dict:
    """One torchrun job; with `fault`, rank 1 is killed or stopped after epoch 1's checkpoint."""
    port = free_port()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
        "--max-restarts=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={out.name}",
        "train.py", "strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
        f"trainer.max_epochs={epochs}", "trainer.deterministic=true", "extras.print_config=false",
        "callbacks.rich_progress_bar=null", f"paths.log_dir={out / 'logs'}",
        "+callbacks.first_step._target_=recovery.FirstStepTime",
    ]  # fmt: skip
    if fault == "stop":
        command.append(f"strategy.timeout.minutes={stop_timeout / 60}")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks"), "PYTHONUNBUFFERED": "1"}
    agent = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[tuple[float, str]] = []
    out.mkdir(parents=True, exist_ok=True)
    live = (out / "live.log").open("w")
    faulted = threading.Event()
    fault_at = [0.0]

    def read() -> None:
        for line in agent.stdout:
            lines.append((time.time(), line))
            live.write(f"{time.time():.2f} {line}")
            live.flush()
            if fault and not faulted.is_set() and "last.ckpt (epoch 1," in line:
                victim = worker_pid(agent, local_rank=1)
                fault_at[0] = time.time()
                os.kill(victim, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
                faulted.set()

    reader = threading.Thread(target=read)
    reader.start()
    agent.wait(timeout=1800)
    reader.join()
    output = "".join(line for _, line in lines)
    log_file = out / "torchrun.log"
    log_file.write_text(output)
    runs = list((out / "logs" / "train" / "runs").iterdir())
    result = {"status": agent.returncode, "log": str(log_file)}
    if (runs[0] / "metrics.json").is_file():
        result["test/acc"] = json.loads((runs[0] / "metrics.json").read_text())["test/acc"]
    if fault:
        t0 = fault_at[0]
        after = [(t, line) for t, line in lines if t > t0]
        resumed = [t for t, line in after if "Resuming from" in line]
        first_steps = [float(m[1]) for _, line in after if (m := re.search(r"at (\d+\.\d+)", line))
                       and FIRST_STEP in line]  # fmt: skip
        noticed = [t for t, line in after if "failed (exitcode" in line]
        result.update(
            torchrun_noticed=round(noticed[0] - t0, 1) if noticed else None,
            resuming_line=round(resumed[0] - t0, 1) if resumed else None,
            first_step=round(min(first_steps) - t0, 1) if first_steps else None,
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["kill", "stop"], choices=["kill", "stop"])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--stop-timeout", type=int, default=30, help="strategy.timeout, seconds")
    parser.add_argument("--out", type=Path, help="keep the runs and their logs here")
    parser.add_argument("--no-reference", action="store_true", help="skip the uninterrupted run")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d')}; {args.epochs} epochs")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.out or tmp
        if not args.no_reference:
            reference = run(Path(tmp) / "reference", args.epochs, None, args.stop_timeout)
            print(
                f"uninterrupted: exit {reference['status']}, test/acc {reference.get('test/acc')}"
            )
        for case in args.cases:
            result = run(Path(tmp) / case, args.epochs, case, args.stop_timeout)
            print(f"{case}: {json.dumps(result)}")
            if result["status"] != 0:
                print(Path(result["log"]).read_text()[-5000:])


if __name__ == "__main__":
    main()
