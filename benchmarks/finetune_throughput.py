"""Fine-tuning throughput, images per second: litforge (`model=timm data=image_folder`, through
the pipeline `python train.py` runs) against the loop users write by hand with timm,
torchvision's `ImageFolder`, a `DataLoader` and `transforms.v2`, in one process each, on the same
folder, network, image size, batch size, worker count and thread count.

    python benchmarks/finetune_throughput.py                     # resnet18 at 128 and 224 px
    python benchmarks/finetune_throughput.py --sizes 160 --model efficientnet_b0 --rounds 3
    python benchmarks/finetune_throughput.py --device cuda --precision bf16-mixed --workers 8

Workload: `--images` RGB JPEG photos of 256×256 px in 10 class folders, written once (random
smooth colour fields, so decoding costs what a photo's does); training: RandomResizedCrop to the
size, horizontal flip, normalization, AdamW, batch 32, 2 loader workers; evaluation: resize the
shorter side, centre crop, forward only. Training images/s are timed from the first to the last
batch of an epoch (the first epoch warms up and is not counted); evaluation over the same folder.
On a GPU (`--device cuda`) both use pinned memory and non-blocking copies, cuDNN autotuning and
TF32 matmuls (what `trainer=gpu` sets), and `--precision bf16-mixed` runs both under autocast.
Needs timm (`pip install -e ".[timm]"`).
"""

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from PIL import Image

from litforge.pipeline import build_datamodule, build_model, build_trainer, fit
from litforge.runs import register_resolvers

ROOT = Path(__file__).resolve().parents[1]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def write_photos(root: Path, count: int, classes: int = 10, size: int = 256) -> Path:
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        coarse = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((size, size), Image.BICUBIC)
        image.save(folder / f"{i:05d}.jpg", quality=90)
    return root


class BatchTimer(L.Callback):
    """Images per second from the first to the last batch of each training epoch and of each
    evaluation (the first batch's wait is the loader's start-up: not counted). Each loop keeps its
    own clock: Lightning validates inside the training epoch, before `on_train_epoch_end`."""

    LOOPS = ("train", "validation")

    def __init__(self) -> None:
        self.rates: dict[str, list[float]] = {loop: [] for loop in self.LOOPS}
        self.began: dict[str, float | None] = dict.fromkeys(self.LOOPS)
        self.ended: dict[str, float] = {}
        self.images: dict[str, int] = dict.fromkeys(self.LOOPS, 0)

    def reset(self, loop: str) -> None:
        self.began[loop], self.images[loop] = None, 0

    def start(self, loop: str, batch) -> None:
        if self.began[loop] is None:
            self.began[loop] = time.perf_counter()
        else:
            self.images[loop] += len(batch[0])

    def end(self, loop: str, last: bool) -> None:
        if last and torch.cuda.is_available():  # the GPU's queued work is part of the epoch
            torch.cuda.synchronize()
        self.ended[loop] = time.perf_counter()

    def rate(self, loop: str) -> None:
        self.rates[loop].append(self.images[loop] / (self.ended[loop] - self.began[loop]))

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.reset("train")

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self.reset("validation")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.start("train", batch)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, *args) -> None:
        self.start("validation", batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.end("train", last=batch_idx == trainer.num_training_batches - 1)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args) -> None:
        self.end("validation", last=batch_idx == trainer.num_val_batches[0] - 1)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.rate("train")

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.rate("validation")


def template_rates(root: Path, args, size: int, extra: list[str]) -> tuple[float, float]:
    register_resolvers()  # as the entry points do
    with tempfile.TemporaryDirectory() as output_dir:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose(
                "train",
                overrides=[
                    "data=image_folder",
                    f"data.root={root}",
                    f"data.image_size={size}",
                    "data.crop_scale=[0.08,1.0]",
                    "data.horizontal_flip=true",
                    f"data.mean={list(MEAN)}",
                    f"data.std={list(STD)}",
                    f"data.batch_size={args.batch_size}",
                    f"data.num_workers={args.workers}",
                    "data.val_fraction=0.2",
                    "data.test_fraction=0.0",
                    "model=timm",
                    f"model.net.model_name={args.model}",
                    f"trainer.max_epochs={args.epochs + 1}",
                    *(["trainer=gpu"] if args.device == "cuda" else ["trainer.accelerator=cpu"]),
                    f"trainer.precision={args.precision}",
                    "+trainer.num_sanity_val_steps=0",
                    f"paths.output_dir={output_dir}",
                    "logger=none",
                    "callbacks.rich_progress_bar=null",
                    *extra,
                ],
            )
        L.seed_everything(0, verbose=False)
        datamodule = build_datamodule(cfg)
        model = build_model(cfg, datamodule)
        trainer = build_trainer(cfg)
        timer = BatchTimer()
        trainer.callbacks.append(timer)
        fit(trainer, model, datamodule)
        trainer.validate(model, datamodule=datamodule)  # as eval.py does: the last rate
    train = timer.rates["train"][1:]
    return len(train) / sum(1 / r for r in train), timer.rates["validation"][-1]


def handwritten_rates(root: Path, args, size: int) -> tuple[float, float]:
    """What a user writes with timm, ImageFolder, DataLoader and transforms.v2."""
    import timm
    from torch.utils.data import DataLoader, Subset
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    to_float = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    train_tf = v2.Compose([v2.RandomResizedCrop(size), v2.RandomHorizontalFlip(), *to_float])
    eval_tf = v2.Compose([v2.Resize(size), v2.CenterCrop(size), *to_float])
    # The same 80/20 split of the same files as litforge's val_fraction=0.2, near enough.
    count = len(ImageFolder(root))
    order = torch.randperm(count, generator=torch.Generator().manual_seed(0)).tolist()
    cut = int(count * 0.8)
    train_set = Subset(ImageFolder(root, transform=train_tf), order[:cut])
    eval_set = Subset(ImageFolder(root, transform=eval_tf), order[cut:])
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    if on_gpu:  # as trainer=gpu sets them for the template
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.benchmark = True
    autocast = torch.autocast(
        device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed"
    )
    loader_args = {"batch_size": args.batch_size, "num_workers": args.workers, "pin_memory": on_gpu}
    persistent = args.workers > 0
    train_loader = DataLoader(train_set, shuffle=True, persistent_workers=persistent, **loader_args)
    eval_loader = DataLoader(eval_set, **loader_args)
    torch.manual_seed(0)
    net = timm.create_model(args.model, num_classes=10).to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    rates = []
    for _ in range(args.epochs + 1):
        net.train()
        images, start = 0, None
        for x, y in train_loader:
            if start is None:
                start = time.perf_counter()
            else:
                images += len(x)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast:
                loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if on_gpu:
            torch.cuda.synchronize()
        rates.append(images / (time.perf_counter() - start))
        with torch.no_grad(), autocast:  # validation each epoch, as the template does
            net.eval()
            for x, _ in eval_loader:
                net(x.to(device, non_blocking=True))
    evaluated, start = 0, None
    with torch.no_grad(), autocast:
        for x, _ in eval_loader:
            if start is None:
                start = time.perf_counter()
            else:
                evaluated += len(x)
            net(x.to(device, non_blocking=True))
    if on_gpu:
        torch.cuda.synchronize()
    train = len(rates[1:]) / sum(1 / r for r in rates[1:])  # the epochs' combined rate
    return train, evaluated / (time.perf_counter() - start)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 224])
    parser.add_argument("--images", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2, help="timed, after one warm-up epoch")
    parser.add_argument("--rounds", type=int, default=2, help="alternating; the median is shown")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["32-true", "bf16-mixed"], default="32-true")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides for litforge's runs")
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> list[tuple[int, str, float, float]]:
    """(size, loop, hand-written img/s, litforge img/s): medians over the rounds."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = write_photos(Path(tmp) / "photos", args.images)
        for size in args.sizes:
            hand, ours = [], []
            for _ in range(args.rounds):
                hand.append(handwritten_rates(root, args, size))
                ours.append(template_rates(root, args, size, args.extra))
            for i, loop in enumerate(("training", "evaluation")):
                h = statistics.median(r[i] for r in hand)
                o = statistics.median(r[i] for r in ours)
                rows.append((size, loop, h, o))
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(
        f"{platform.processor() or platform.machine()}, {device}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; {args.model}, {args.images} JPEGs 256 px, batch "
        f"{args.batch_size}, {args.workers} workers, {args.precision}",
        flush=True,
    )
    print("| size | loop | hand-written, img/s | litforge, img/s | ratio |")
    print("|--:|---|--:|--:|--:|")
    for size, loop, h, o in measure(args):
        print(f"| {size} | {loop} | {h:.1f} | {o:.1f} | {o / h:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
