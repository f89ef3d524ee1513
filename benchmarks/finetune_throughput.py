"""Fine-tuning throughput, images per second: litforge (`model=timm data=image_folder`, through
the pipeline `python train.py` runs) against the loop users write by hand with timm,
torchvision's `ImageFolder`, a `DataLoader` and `transforms.v2`, in one process each, on the same
folder, network, image size, batch size, worker count and thread count.

    python benchmarks/finetune_throughput.py                     # resnet18 at 128 and 224 px
    python benchmarks/finetune_throughput.py --sizes 160 --model efficientnet_b0 --rounds 3

Workload: `--images` RGB JPEG photos of 256×256 px in 10 class folders, written once (random
smooth colour fields, so decoding costs what a photo's does); training: RandomResizedCrop to the
size, horizontal flip, normalization, AdamW, batch 32, 2 loader workers; evaluation: resize the
shorter side, centre crop, forward only. Training images/s are timed from the first to the last
batch of an epoch (the first epoch warms up and is not counted); evaluation over the same folder.
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
    evaluation (the first batch's wait is the loader's start-up: not counted)."""

    def __init__(self) -> None:
        self.rates: dict[str, list[float]] = {"train": [], "validation": []}

    def start(self, batch) -> None:
        if self.began is None:
            self.began = time.perf_counter()
        else:
            self.images += len(batch[0])

    def end(self) -> None:
        self.ended = time.perf_counter()

    def reset(self, *args) -> None:
        self.began, self.images = None, 0

    def rate(self, loop: str) -> None:
        self.rates[loop].append(self.images / (self.ended - self.began))

    on_train_epoch_start = on_validation_epoch_start = reset

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.start(batch)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, *args) -> None:
        self.start(batch)

    def on_train_batch_end(self, *args) -> None:
        self.end()

    def on_validation_batch_end(self, *args) -> None:
        self.end()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.rate("train")

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.rate("validation")


def template_rates(root: Path, args, size: int, extra: list[str]) -> tuple[float, float]:
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
                    "trainer.accelerator=cpu",
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
    loader_args = {"batch_size": args.batch_size, "num_workers": args.workers}
    train_loader = DataLoader(train_set, shuffle=True, persistent_workers=True, **loader_args)
    eval_loader = DataLoader(eval_set, **loader_args)
    torch.manual_seed(0)
    net = timm.create_model(args.model, num_classes=10)
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
            loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        rates.append(images / (time.perf_counter() - start))
        with torch.no_grad():  # validation each epoch, as the template does
            net.eval()
            for x, _ in eval_loader:
                net(x)
    evaluated, start = 0, None
    with torch.no_grad():
        for x, _ in eval_loader:
            if start is None:
                start = time.perf_counter()
            else:
                evaluated += len(x)
            net(x)
    train = len(rates[1:]) / sum(1 / r for r in rates[1:])  # the epochs' combined rate
    return train, evaluated / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 224])
    parser.add_argument("--images", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2, help="timed, after one warm-up epoch")
    parser.add_argument("--rounds", type=int, default=2, help="alternating; the median is shown")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides for litforge's runs")
    args = parser.parse_args(argv)
    print(
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; {args.model}, {args.images} JPEGs 256 px, batch "
        f"{args.batch_size}, {args.workers} workers"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = write_photos(Path(tmp) / "photos", args.images)
        print("| size | loop | hand-written, img/s | litforge, img/s | ratio |")
        print("|--:|---|--:|--:|--:|")
        for size in args.sizes:
            hand, ours = [], []
            for _ in range(args.rounds):
                hand.append(handwritten_rates(root, args, size))
                ours.append(template_rates(root, args, size, args.extra))
            for i, loop in enumerate(("training", "evaluation")):
                h = statistics.median(r[i] for r in hand)
                o = statistics.median(r[i] for r in ours)
                print(f"| {size} | {loop} | {h:.1f} | {o:.1f} | {o / h:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
