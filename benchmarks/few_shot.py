"""Does a pretrained backbone pay off on a few photos? Fashion-MNIST split in two, on real data:

1. pretrain a timm network on classes 0-4 in plain PyTorch, and save its weights as a local
   file (what you would download, or train on a related dataset of your own);
2. write a few-shot image folder of the other classes, 5-9: `--shots` training images per class
   (ROOT/train/<class>/), and `--test-per-class` test images per class from the test set;
3. fine-tune through litforge (`model=timm model.net.pretrained_file=...`) and train the same
   network from scratch on that folder, and print both test accuracies.

    python benchmarks/few_shot.py                  # test_resnet, 30 shots: a few minutes on 2 cores
    python benchmarks/few_shot.py --model resnet10t --pretrain-epochs 3

Needs Fashion-MNIST (`make data`) and timm (`pip install -e ".[timm]"`).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

from litforge.data.fashion_mnist import FashionMNISTDataModule

ROOT = Path(__file__).resolve().parents[1]
MEAN, STD = FashionMNISTDataModule.mean[0], FashionMNISTDataModule.std[0]


def pretrain(model: str, images, labels, epochs: int, path: Path, seed: int) -> None:
    """A hand-written loop: the network learns classes 0-4; its weights go to `path`."""
    import timm

    torch.manual_seed(seed)
    net = timm.create_model(model, num_classes=5, in_chans=1)
    optimizer = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4)
    x_all = (images.float() / 255 - MEAN) / STD
    net.train()
    for epoch in range(epochs):
        order = torch.randperm(len(labels))
        for start in range(0, len(order), 128):
            batch = order[start : start + 128]
            loss = F.cross_entropy(net(x_all[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"pretraining epoch {epoch + 1}/{epochs}: loss {loss.item():.3f}", flush=True)
    torch.save(net.state_dict(), path)


def write_folder(root: Path, split: str, images, labels, per_class: int, names) -> None:
    for label in range(5, 10):
        folder = root / split / names[label].replace("/", "-")
        folder.mkdir(parents=True)
        picked = (labels == label).nonzero().flatten()[:per_class]
        for i in picked.tolist():
            Image.fromarray(images[i, 0].numpy()).save(folder / f"{i}.png")


def fine_tune(root: Path, run_dir: Path, model: str, weights: Path | None, args) -> float:
    """`python train.py` on the few-shot folder; its test accuracy."""
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "data=image_folder",
        f"data.root={root}",
        "data.image_size=28",  # the pretraining's own size and normalization, not timm's
        f"data.mean=[{MEAN}]",
        f"data.std=[{STD}]",
        f"data.batch_size={args.batch_size}",
        "data.num_workers=0",  # 150 small files: workers would cost more than they save
        "data.horizontal_flip=true",
        "model=timm",
        f"model.net.model_name={model}",
        f"trainer.max_epochs={args.epochs}",
        "trainer.accelerator=cpu",
        f"seed={args.seed}",
        "logger=none",
        "callbacks.rich_progress_bar=null",
        f"hydra.run.dir={run_dir}",
        *([f"model.net.pretrained_file={weights}"] if weights else []),
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads((run_dir / "metrics.json").read_text())["test/acc"]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="test_resnet", help="a timm model name")
    parser.add_argument("--pretrain-images", type=int, default=30000, help="of classes 0-4")
    parser.add_argument("--pretrain-epochs", type=int, default=3)
    parser.add_argument("--shots", type=int, default=30, help="training images per class")
    parser.add_argument("--test-per-class", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=15, help="of fine-tuning")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", help="keep the weights, folder and runs here")
    args = parser.parse_args(argv)

    fashion_mnist = FashionMNISTDataModule(root=str(ROOT / "data"))
    fashion_mnist.prepare_data()
    train_images, train_labels = fashion_mnist.read(train=True)
    test_images, test_labels = fashion_mnist.read(train=False)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        weights = work / f"{args.model}-classes0-4.pth"
        first = (train_labels < 5).nonzero().flatten()[: args.pretrain_images]
        pretrain(
            args.model, train_images[first], train_labels[first], args.pretrain_epochs,
            weights, args.seed,
        )  # fmt: skip
        names = FashionMNISTDataModule.class_names
        root = work / "few_shot"
        write_folder(root, "train", train_images, train_labels, args.shots, names)
        write_folder(root, "test", test_images, test_labels, args.test_per_class, names)
        results = {
            "pretrained": fine_tune(root, work / "pretrained", args.model, weights, args),
            "scratch": fine_tune(root, work / "scratch", args.model, None, args),
        }
    print(f"\n{args.model}, {args.shots} images per class of classes 5-9, {args.epochs} epochs:")
    print("| start | test accuracy |\n|---|--:|")
    for start, accuracy in results.items():
        print(f"| {start} | {accuracy:.3f} |")
    return results


if __name__ == "__main__":
    main()
