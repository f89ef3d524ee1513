"""Seconds per epoch: the template (`Trainer.fit` through litforge's pipeline) against bare
Lightning (a LightningModule as Lightning's docs write it: `self.log` of the training loss in
`training_step`, of the accuracy in `validation_step`, automatic optimization; a Trainer with no
logger, checkpoints, progress bar or summary, on the template's own datamodule) and against a
minimal hand-written PyTorch loop, in one process, on the same data, network, batch size, device,
precision and thread count; and the fixed cost of a run (start-up and teardown) against a plain
script's. Needs Fashion-MNIST (`make data`).

    python benchmarks/epoch_time.py                        # every workload, 3 rounds of 3 epochs
    python benchmarks/epoch_time.py --workloads small-step --extras
    python benchmarks/epoch_time.py --fixed-runs 0 trainer=gpu trainer.accelerator=gpu  # a GPU
    python benchmarks/epoch_time.py --workloads small-step --fixed-runs 0 --stock progress_bar

`--stock PART ...` adds a row per part: the template with that part of ours swapped for
Lightning's own (the reason docs/architecture.md gives for keeping ours), in the same rounds.

Workloads (the network is trained on Fashion-MNIST, Adam-type optimizer, batch norm):
- `small-step`: MLP 784-64-128-64-10, no dropout, batch 128: 430 cheap steps an epoch, where the
  framework's cost per step shows most;
- `default`: what `python train.py` trains (MLP 784-512-256-10, batch 256);
- `cnn`: `model=cnn` as configured (batch 256, channels-last).
An epoch is one pass over the 55k training images plus one over the 5k validation images; the
first (warm-up) epoch is not counted. `--extras` adds `model.compile=true` rows.

The fixed cost: `python train.py` for one training batch and one validation batch (default
callbacks and logger, so checkpoints too; no test stage), start to exit, against
`bare_lightning_run.py` (a Lightning script with the Trainer's defaults: the same batches, logger
and checkpoint) and `handwritten_run.py` (import torch, read the files, one step, save), each
run `--fixed-runs` times, alternating. (Loading image files: `data_loading.py`.)
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from litforge.data.base import model_arguments
from litforge.data.images import normalize
from litforge.pipeline import build_datamodule, build_model, build_trainer, fit
from litforge.runs import register_resolvers

ROOT = Path(__file__).resolve().parents[1]
# The parts of the template that replace Lightning's for speed (docs/architecture.md): the
# overrides that put Lightning's back (`--stock`).
STOCK = {
    "progress_bar": [
        "callbacks.rich_progress_bar._target_=lightning.pytorch.callbacks.RichProgressBar"
    ],
}


def synchronize() -> None:
    """Wait for the GPU's queued work (a GPU runs behind the Python that queues it)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class EpochTimer(L.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        synchronize()
        self.start = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # after validation + checkpoint
        synchronize()
        self.times.append(time.perf_counter() - self.start)


def apply_gpu_settings(cfg) -> None:
    """What `build_trainer` sets for the template, set for the other setups too: the matmul
    precision and cuDNN autotuning (`trainer=gpu` turns both on)."""
    if cfg.trainer.get("float32_matmul_precision"):
        torch.set_float32_matmul_precision(cfg.trainer.float32_matmul_precision)
    torch.backends.cudnn.benchmark = bool(cfg.trainer.benchmark)


def config(model: str, epochs: int, output_dir: str, overrides: list[str]):
    register_resolvers()  # as the entry points do
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(
            "train",
            overrides=[
                f"model={model}",
                f"trainer.max_epochs={epochs}",
                "trainer.accelerator=cpu",
                f"paths.output_dir={output_dir}",
                f"paths.root_dir={ROOT}",
                "data.download=false",
                *overrides,
            ],
        )


def template_epochs(
    model: str,
    epochs: int,
    overrides: list[str],
    callbacks: list[L.Callback] = (),
    stock: str | None = None,
) -> list[float]:
    """The template's epochs; with `stock`, with that part of `STOCK` Lightning's own."""
    with tempfile.TemporaryDirectory() as output_dir:
        cfg = config(model, epochs + 1, output_dir, [*overrides, *STOCK.get(stock, [])])
        L.seed_everything(0, verbose=False)
        datamodule = build_datamodule(cfg)
        net = build_model(cfg, datamodule)
        trainer = build_trainer(cfg)
        timer = EpochTimer()
        trainer.callbacks.extend([timer, *callbacks])
        fit(trainer, net, datamodule)  # as `python train.py` does
    return timer.times[1:]


class BareModule(L.LightningModule):
    """What a Lightning user writes first, as Lightning's docs write it: the step logging its
    loss, a validation accuracy, the optimizer."""

    def __init__(self, net: torch.nn.Module, optimizer) -> None:
        super().__init__()
        self.net, self.make_optimizer = net, optimizer

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return self.make_optimizer(params=self.parameters())


def bare_lightning_epochs(
    model: str, epochs: int, overrides: list[str], callbacks: list[L.Callback] = ()
) -> list[float]:
    """The floor a Lightning user picks: a minimal module and Trainer on the same data."""
    with tempfile.TemporaryDirectory() as output_dir:
        cfg = config(model, epochs + 1, output_dir, overrides)
        apply_gpu_settings(cfg)
        L.seed_everything(0, verbose=False)
        datamodule = build_datamodule(cfg)
        shape = model_arguments(datamodule)["input_shape"]
        net = instantiate(cfg.model.net, input_shape=shape, num_classes=10)
        if cfg.model.get("channels_last"):
            net = net.to(memory_format=torch.channels_last)
        module = BareModule(net, instantiate(cfg.model.optimizer))
        timer = EpochTimer()
        trainer = L.Trainer(
            max_epochs=epochs + 1,
            accelerator=cfg.trainer.accelerator,
            precision=cfg.trainer.precision,
            benchmark=cfg.trainer.benchmark,
            limit_train_batches=cfg.trainer.limit_train_batches,
            limit_val_batches=cfg.trainer.limit_val_batches,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[timer, *callbacks],
            default_root_dir=output_dir,
        )
        trainer.fit(module, datamodule=datamodule)
    return timer.times[1:]


def handwritten_epochs(model: str, epochs: int, overrides: list[str]) -> list[float]:
    """The floor: a plain loop over pre-normalized tensors on the device, no framework; under
    `trainer.precision=bf16-mixed` in `torch.autocast` as Lightning runs it."""
    with tempfile.TemporaryDirectory() as output_dir:
        cfg = config(model, epochs + 1, output_dir, overrides)
    apply_gpu_settings(cfg)
    on_gpu = cfg.trainer.accelerator in ("gpu", "cuda") or (
        cfg.trainer.accelerator == "auto" and torch.cuda.is_available()
    )
    device = torch.device("cuda" if on_gpu else "cpu")
    bf16 = cfg.trainer.precision == "bf16-mixed"
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("fit")
    x_train, y_train = datamodule.splits["train"]
    x_val, y_val = datamodule.splits["val"]
    mean, std = torch.tensor(datamodule.mean), torch.tensor(datamodule.std)
    x_train, x_val = normalize(x_train, mean, std), normalize(x_val, mean, std)
    x_train, y_train, x_val, y_val = (t.to(device) for t in (x_train, y_train, x_val, y_val))
    torch.manual_seed(0)
    net = instantiate(cfg.model.net, input_shape=datamodule.input_shape, num_classes=10)
    net = net.to(device)
    if cfg.model.get("channels_last"):
        net = net.to(memory_format=torch.channels_last)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    optimizer = instantiate(cfg.model.optimizer)(params=net.parameters())
    batch = cfg.data.batch_size
    times = []
    for _ in range(epochs + 1):
        synchronize()
        start = time.perf_counter()
        net.train()
        order = torch.randperm(len(y_train), device=device)
        for i in range(0, len(order), batch):
            index = order[i : i + batch]
            with autocast:
                loss = F.cross_entropy(net(x_train[index]), y_train[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        net.eval()
        correct = 0
        with torch.no_grad(), autocast:
            for i in range(0, len(y_val), batch):
                correct += (net(x_val[i : i + batch]).argmax(1) == y_val[i : i + batch]).sum()
        correct = int(correct)  # the epoch's result, as a user prints it
        times.append(time.perf_counter() - start)
    return times[1:]


WORKLOADS = {
    "small-step": (
        "mlp",
        ["data.batch_size=128", "model.net.hidden_sizes=[64,128,64]", "model.net.dropout=0"],
    ),
    "default": ("mlp", []),
    "cnn": ("cnn", []),
}


def run_seconds(command: list[str]) -> float:
    """Wall time of one `python ...` run, start to exit."""
    start = time.perf_counter()
    subprocess.run([sys.executable, *command], cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def fixed_costs(runs: int) -> dict[str, float]:
    """Median seconds of a minimal run of each: the plain script, the bare Lightning script and
    `python train.py`, alternating."""
    data = fashion_mnist_files()
    seconds: dict[str, list[float]] = {"script": [], "bare": [], "template": []}
    for _ in range(runs):
        for name in ("handwritten_run", "bare_lightning_run"):
            key = "script" if name == "handwritten_run" else "bare"
            seconds[key].append(
                run_seconds([f"benchmarks/{name}.py", "--steps=1", f"--data={data}"])
            )
        with tempfile.TemporaryDirectory() as run_dir:
            seconds["template"].append(
                run_seconds(
                    [
                        "train.py",
                        "trainer.max_epochs=1",
                        "trainer.limit_train_batches=1",
                        "trainer.limit_val_batches=1",
                        "test=false",
                        "data.download=false",
                        f"hydra.run.dir={run_dir}",
                    ]
                )
            )
    return {key: statistics.median(values) for key, values in seconds.items()}


def fashion_mnist_files() -> Path:
    """The folder of Fashion-MNIST's IDX files, where torchvision reads them."""
    with tempfile.TemporaryDirectory() as output_dir:
        datamodule = build_datamodule(config("mlp", 1, output_dir, []))
    datamodule.prepare_data()
    return datamodule.root / datamodule.folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="*", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs, after one warm-up")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of loop and template")
    parser.add_argument("--fixed-runs", type=int, default=3, help="minimal runs of each; 0: none")
    parser.add_argument("--extras", action="store_true", help="also model.compile=true")
    parser.add_argument(
        "--stock",
        nargs="*",
        choices=list(STOCK),
        default=[],
        help="also the template with this part Lightning's own (a row each)",
    )
    parser.add_argument(
        "overrides", nargs="*", help="config overrides for all, e.g. trainer.precision=bf16-mixed"
    )
    args = parser.parse_args()

    print(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, lightning {L.__version__}; Fashion-MNIST, "
        f"{args.rounds} x {args.epochs} warm epochs each; "
        f"overrides: {' '.join(args.overrides) or 'none'}",
        flush=True,
    )
    rows = []
    paired: list[tuple[str, str, float]] = []  # (workload, stock part, its round's ratio)
    for workload in args.workloads:
        model, overrides = WORKLOADS[workload]
        overrides = [*overrides, *args.overrides]
        runs = [("litforge", overrides, None)]
        if args.extras:
            runs += [("litforge, model.compile=true", [*overrides, "model.compile=true"], None)]
        runs += [(f"litforge, stock {part}", overrides, part) for part in args.stock]
        # Alternate the loop and the template for `--rounds` rounds and pool each one's epochs:
        # load on a shared machine drifts, and a setup timed in one block would catch one phase.
        epochs: dict[str, list[float]] = {"hand-written loop": [], "bare Lightning": []}
        for _ in range(args.rounds):
            epochs["hand-written loop"] += handwritten_epochs(model, args.epochs, overrides)
            epochs["bare Lightning"] += bare_lightning_epochs(model, args.epochs, overrides)
            for name, setup, stock in runs:
                times = template_epochs(model, args.epochs, setup, stock=stock)
                epochs.setdefault(name, []).extend(times)
                if stock:  # against the template's epochs of the same round, timed just before
                    ours = statistics.median(epochs["litforge"][-args.epochs :])
                    ratio = statistics.median(times) / ours
                    paired.append((workload, stock, ratio))
        with tempfile.TemporaryDirectory() as output_dir:
            batch = config(model, 1, output_dir, overrides).data.batch_size
        steps = math.ceil(55000 / batch)
        floor = statistics.median(epochs["hand-written loop"])
        bare = statistics.median(epochs["bare Lightning"])
        for name, times in epochs.items():
            seconds = statistics.median(times)
            extra_ms = (seconds - bare) / steps * 1000
            rows.append((workload, model, name, seconds, seconds / bare, seconds / floor, extra_ms))

    if rows:
        print(
            "\n| workload | model | setup | s/epoch | vs bare Lightning | vs hand-written "
            "| ms/step over bare Lightning |"
        )
        print("|---|---|---|---|---|---|---|")
    for workload, model, name, seconds, vs_bare, vs_loop, extra_ms in rows:
        extra = f"{extra_ms:+.2f}" if name.startswith("litforge") else ""
        print(
            f"| {workload} | {model} | {name} | {seconds:.2f} | {vs_bare:.2f} | {vs_loop:.2f} "
            f"| {extra} |"
        )
    if paired:
        print(
            "\n| workload | part put back to Lightning's | s/epoch vs litforge, median of the "
            "rounds (min-max) |"
        )
        print("|---|---|---|")
    for workload in args.workloads:
        for part in args.stock:
            ratios = [r for w, p, r in paired if (w, p) == (workload, part)]
            print(
                f"| {workload} | {part} | {statistics.median(ratios):.3f} "
                f"({min(ratios):.3f}-{max(ratios):.3f}) |"
            )
    if args.fixed_runs:
        runs = fixed_costs(args.fixed_runs)
        print(f"\n| a minimal run, start to exit (median of {args.fixed_runs}) | seconds |")
        print("|---|---|")
        print(f"| hand-written script (`benchmarks/handwritten_run.py`) | {runs['script']:.2f} |")
        print(f"| bare Lightning (`benchmarks/bare_lightning_run.py`) | {runs['bare']:.2f} |")
        print(
            f"| `python train.py`, one training and one validation batch | {runs['template']:.2f} |"
        )
        print(f"| fixed cost over bare Lightning | {runs['template'] - runs['bare']:.2f} |")
        print(
            f"| fixed cost over the hand-written script | {runs['template'] - runs['script']:.2f} |"
        )


if __name__ == "__main__":
    main()
