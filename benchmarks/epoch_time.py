"""Seconds per epoch: the template (`Trainer.fit` through litforge's pipeline) against a minimal
hand-written PyTorch loop, in one process, on the same data tensors, network, batch size, device
and thread count. Needs Fashion-MNIST (`make data`).

    python benchmarks/epoch_time.py                       # MLP and CNN, 3 warm epochs each
    python benchmarks/epoch_time.py --models mlp --epochs 5 --extras

An epoch is one pass over the 55k training images plus one over the 5k validation images; the
first (warm-up) epoch is not counted. `--extras` adds a row for `model.compile=true`, and the time
from `python train.py` to the end of a one-step run. (Loading image files: `data_loading.py`.)
"""

from __future__ import annotations

import argparse
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

from litforge.pipeline import build_datamodule, build_model, build_trainer, fit

ROOT = Path(__file__).resolve().parents[1]


class EpochTimer(L.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.start = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # after validation + checkpoint
        self.times.append(time.perf_counter() - self.start)


def config(model: str, epochs: int, output_dir: str, overrides: list[str]):
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


def template_epochs(model: str, epochs: int, overrides: list[str]) -> list[float]:
    with tempfile.TemporaryDirectory() as output_dir:
        cfg = config(model, epochs + 1, output_dir, overrides)
        L.seed_everything(0, verbose=False)
        datamodule = build_datamodule(cfg)
        net = build_model(cfg, datamodule)
        trainer = build_trainer(cfg)
        timer = EpochTimer()
        trainer.callbacks.append(timer)
        fit(trainer, net, datamodule)  # as `python train.py` does
    return timer.times[1:]


def handwritten_epochs(model: str, epochs: int, overrides: list[str]) -> list[float]:
    """The floor: a plain loop over pre-normalized tensors, no framework."""
    with tempfile.TemporaryDirectory() as output_dir:
        cfg = config(model, epochs + 1, output_dir, overrides)
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("fit")
    x_train, y_train = datamodule.splits["train"]
    x_val, y_val = datamodule.splits["val"]
    x_train, x_val = datamodule._normalize(x_train), datamodule._normalize(x_val)
    torch.manual_seed(0)
    net = instantiate(cfg.model.net, input_shape=datamodule.input_shape, num_classes=10)
    if cfg.model.get("channels_last"):
        net = net.to(memory_format=torch.channels_last)
    optimizer = instantiate(cfg.model.optimizer)(params=net.parameters())
    batch = cfg.data.batch_size
    times = []
    for _ in range(epochs + 1):
        start = time.perf_counter()
        net.train()
        order = torch.randperm(len(y_train))
        for i in range(0, len(order), batch):
            index = order[i : i + batch]
            loss = F.cross_entropy(net(x_train[index]), y_train[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        net.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(y_val), batch):
                correct += (net(x_val[i : i + batch]).argmax(1) == y_val[i : i + batch]).sum()
        times.append(time.perf_counter() - start)
    return times[1:]


def startup_seconds() -> float:
    """Wall time of `python train.py` for a one-step run, start to exit."""
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "train.py",
            "trainer.max_steps=1",
            "trainer.limit_val_batches=0",
            "test=false",
            "logger=none",
            "callbacks=none",
            "extras.print_config=false",
            "optimized_metric=null",
            f"hydra.run.dir={tempfile.mkdtemp()}",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs, after one warm-up")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of loop and template")
    parser.add_argument("--extras", action="store_true", help="also compile, start-up")
    parser.add_argument(
        "overrides", nargs="*", help="config overrides for both, e.g. data.batch_size=256"
    )
    args = parser.parse_args()

    print(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, lightning {L.__version__}; Fashion-MNIST, "
        f"{args.rounds} x {args.epochs} warm epochs each; "
        f"overrides: {' '.join(args.overrides) or 'none'}"
    )
    rows = []
    for model in args.models:
        runs = [("litforge", args.overrides)]
        if args.extras:
            runs += [
                ("litforge, model.compile=true", [*args.overrides, "model.compile=true"]),
            ]
        # Alternate the loop and the template for `--rounds` rounds and pool each one's epochs:
        # load on a shared machine drifts, and a setup timed in one block would catch one phase.
        epochs: dict[str, list[float]] = {"hand-written loop": []}
        for _ in range(args.rounds):
            epochs["hand-written loop"] += handwritten_epochs(model, args.epochs, args.overrides)
            for name, overrides in runs:
                epochs.setdefault(name, []).extend(template_epochs(model, args.epochs, overrides))
        floor = statistics.median(epochs["hand-written loop"])
        for name, times in epochs.items():
            seconds = statistics.median(times)
            rows.append((model, name, seconds, 60000 / seconds, seconds / floor))

    print("\n| model | setup | s/epoch | samples/s | vs hand-written |\n|---|---|---|---|---|")
    for model, name, seconds, rate, ratio in rows:
        print(f"| {model} | {name} | {seconds:.2f} | {rate:,.0f} | {ratio:.2f} |")
    if args.extras:
        print(f"\n`python train.py`, one-step run, start to exit: {startup_seconds():.1f} s")


if __name__ == "__main__":
    main()
