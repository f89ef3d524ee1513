"""`make bench-gpu`: the template on a GPU in one command (about 6 minutes on one H100), printed
as markdown tables, each as soon as it is measured:

1. seconds per epoch of the template, bare Lightning as its docs write it and a hand-written loop
   (`epoch_time.py`), in 32-true and bf16-mixed, on the small-step MLP, the default MLP and the
   CNN; one process, data on the GPU, `trainer=gpu`'s settings (TF32 matmuls, cuDNN autotuning)
   for all three;
2. host-GPU synchronizations per training step of the template and of bare Lightning (the
   default MLP): `torch.cuda.set_sync_debug_mode("warn")` warns at each one; the warnings are
   counted over `--sync-steps` steps, the hooks and batch fetching between them included;
3. `python train.py experiment=fashion_mnist_cnn trainer=gpu`, start to exit, and its test
   accuracy;
4. fine-tuning images per second (`finetune_throughput.py`): resnet18 at 128 and 224 px, 2,048
   JPEGs, batch 64, the template against a hand-written timm loop, both in bf16-mixed.

Without a GPU (or with `--device cpu`) it runs on the CPU, short (`--quick`, the default there:
the small-step MLP only, one timed epoch, the experiment for a few batches, timm's tiny test
network at 64 px); host syncs are counted on GPUs only. Needs Fashion-MNIST (`make data`), and
timm for part 4. Trailing arguments are config overrides for parts 1-3.

    python benchmarks/gpu.py                               # the device it finds
    python benchmarks/gpu.py --device cpu --quick data.val_size=1000
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import epoch_time
import lightning as L
import torch

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("32-true", "bf16-mixed")
REPORT: list[str] = []  # every table's lines, printed again together at the end


def table(*lines: str) -> None:
    """Print lines of the report now (between the runs' own output) and keep them for the end."""
    print("\n".join(lines), flush=True)
    REPORT.extend(lines)


class SyncCounter(L.Callback):
    """Counts the host-GPU synchronizations from training step `skip` to `skip + steps`."""

    def __init__(self, skip: int, steps: int) -> None:
        self.skip, self.steps = skip, steps
        self.count: int | None = None
        self._recording: warnings.catch_warnings | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.skip:
            self._recording = warnings.catch_warnings(record=True)
            self._caught = self._recording.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        elif batch_idx == self.skip + self.steps:
            self._stop()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._recording is not None:
            raise RuntimeError(f"the epoch ended before step {self.skip + self.steps}")

    def _stop(self) -> None:
        torch.cuda.set_sync_debug_mode("default")
        self._recording.__exit__(None, None, None)
        self._recording = None
        self.count = sum("synchroniz" in str(w.message) for w in self._caught)


def device_overrides(device: str) -> list[str]:
    return ["trainer=gpu", "trainer.accelerator=gpu"] if device == "cuda" else []


def epoch_table(args) -> None:
    workloads = ["small-step"] if args.quick else list(epoch_time.WORKLOADS)
    table(
        f"\n### Seconds per epoch (median of {args.epochs} after a warm-up epoch)\n",
        "| workload | precision | hand-written | bare Lightning | template "
        "| template / bare | template / hand-written |",
        "|---|---|--:|--:|--:|--:|--:|",
    )
    for workload in workloads:
        model, overrides = epoch_time.WORKLOADS[workload]
        for precision in PRECISIONS:
            setup = [
                *overrides,
                *device_overrides(args.device),
                f"trainer.precision={precision}",
                *args.overrides,
            ]
            hand = statistics.median(epoch_time.handwritten_epochs(model, args.epochs, setup))
            bare = statistics.median(epoch_time.bare_lightning_epochs(model, args.epochs, setup))
            ours = statistics.median(epoch_time.template_epochs(model, args.epochs, setup))
            table(
                f"| {workload} | {precision} | {hand:.2f} | {bare:.2f} | {ours:.2f} "
                f"| {ours / bare:.2f} | {ours / hand:.2f} |"
            )


def sync_table(args) -> None:
    if args.device != "cuda":
        table("\n(Host-GPU syncs: counted on GPUs only)")
        return
    model, overrides = epoch_time.WORKLOADS["default"]
    skip = 20
    limits = [f"trainer.limit_train_batches={skip + args.sync_steps + 1}"]
    limits.append("trainer.limit_val_batches=2")
    setup = [*overrides, *device_overrides(args.device), *limits, *args.overrides]
    counts = {}
    for name, run in (
        ("bare Lightning", epoch_time.bare_lightning_epochs),
        ("template", epoch_time.template_epochs),
    ):
        counter = SyncCounter(skip, args.sync_steps)
        run(model, 0, setup, callbacks=[counter])
        counts[name] = counter.count / args.sync_steps
    table(
        f"\n### Host-GPU syncs per training step (default MLP, over {args.sync_steps} steps)\n",
        "| setup | syncs per step |",
        "|---|--:|",
        *(f"| {name} | {per_step:.2f} |" for name, per_step in counts.items()),
    )


def whole_run(args) -> None:
    command = ["train.py", "experiment=fashion_mnist_cnn"]
    command += ["trainer=gpu"] if args.device == "cuda" else ["trainer=cpu"]
    if args.quick:
        command += ["trainer.max_epochs=1", "trainer.limit_train_batches=10"]
        command += ["trainer.limit_val_batches=2", "trainer.limit_test_batches=2"]
    with tempfile.TemporaryDirectory() as run_dir:
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, *command, f"hydra.run.dir={run_dir}", *args.overrides],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            raise RuntimeError(f"train.py failed:\n{result.stderr[-3000:]}")
        accuracy = json.loads((Path(run_dir) / "metrics.json").read_text())["test/acc"]
    table(
        "\n### A whole run, start to exit\n",
        "| command | seconds | test accuracy |",
        "|---|--:|--:|",
        f"| `python {' '.join([*command, *args.overrides])}` | {seconds:.1f} | {accuracy:.4f} |",
    )


def finetune_table(args) -> None:
    import finetune_throughput  # needs timm

    if args.quick:
        settings = ["--model", "test_resnet", "--sizes", "64", "--images", "96"]
        settings += ["--batch-size", "8", "--workers", "0", "--epochs", "1"]
    else:
        settings = ["--images", "2048", "--batch-size", "64", "--epochs", "2"]
        settings += ["--workers", str(min(8, os.cpu_count() or 1))]
    precision = "bf16-mixed" if args.device == "cuda" else "32-true"
    settings += ["--rounds", "1", "--device", args.device, "--precision", precision]
    options = finetune_throughput.parse_args(settings)
    rows = finetune_throughput.measure(options)
    table(
        f"\n### Fine-tuning images per second ({options.model}, {precision})\n",
        "| size | loop | hand-written | template | template / hand-written |",
        "|--:|---|--:|--:|--:|",
        *(
            f"| {size} | {loop} | {hand:.0f} | {ours:.0f} | {ours / hand:.2f} |"
            for size, loop, hand, ours in rows
        ),
    )


def timed(part, args) -> bool:
    """Run one part; a part that fails is reported, and the others still run."""
    start = time.perf_counter()
    try:
        part(args)
    except Exception:
        traceback.print_exc()
        table(f"\n({part.__name__} failed: see its traceback above)")
        return False
    print(f"\n({part.__name__} took {time.perf_counter() - start:.0f} s)", flush=True)
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument(
        "--quick",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a short run (default: on the CPU only)",
    )
    parser.add_argument("--epochs", type=int, default=None, help="timed epochs (2; quick: 1)")
    parser.add_argument("--sync-steps", type=int, default=100)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. data.val_size=1000")
    args = parser.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick is None:
        args.quick = args.device == "cpu"
    if args.epochs is None:
        args.epochs = 1 if args.quick else 2
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    table(
        f"{device}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, lightning {L.__version__}"
        f"{', quick' if args.quick else ''}; overrides: {' '.join(args.overrides) or 'none'}"
    )
    parts = [epoch_table, sync_table, whole_run]
    parts.append(finetune_table)  # feature: backbones
    failed = [part.__name__ for part in parts if not timed(part, args)]
    print("\n## make bench-gpu: all tables\n\n" + "\n".join(REPORT), flush=True)
    sys.exit(f"failed: {', '.join(failed)}" if failed else 0)


if __name__ == "__main__":
    main()
