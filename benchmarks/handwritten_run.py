"""A plain PyTorch training script, started cold: what `epoch_time.py` measures `python train.py`'s
fixed cost against. It imports torch, reads Fashion-MNIST's IDX files, builds the default MLP,
trains `--steps` steps (batch 256, AdamW), writes the weights and exits. No framework, no config.

    python benchmarks/handwritten_run.py --steps 1 --data /usr/share/datasets/fashion-mnist
"""

import argparse
import gzip
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn


def read_idx(path: Path, offset: int) -> np.ndarray:
    """An IDX file's array, from the file or its gzipped copy (`path`.gz)."""
    data = path.read_bytes() if path.is_file() else gzip.decompress(Path(f"{path}.gz").read_bytes())
    return np.frombuffer(data, np.uint8, offset=offset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, required=True, help="folder of the IDX files (or gzipped)"
    )
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()

    images = read_idx(args.data / "train-images-idx3-ubyte", 16).reshape(-1, 1, 28, 28)
    labels = read_idx(args.data / "train-labels-idx1-ubyte", 8).astype(np.int64)
    labels = torch.from_numpy(labels)
    x = (torch.from_numpy(images.copy()).float() / 255 - 0.286) / 0.353
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 512),
        nn.BatchNorm1d(512),
        nn.ReLU(),
        nn.Linear(512, 256),
        nn.BatchNorm1d(256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-4)
    order = torch.randperm(len(labels))
    for step in range(args.steps):
        index = order[step * 256 : (step + 1) * 256]
        loss = nn.functional.cross_entropy(net(x[index]), labels[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with tempfile.TemporaryDirectory() as folder:
        torch.save({"net": net.state_dict(), "optimizer": optimizer.state_dict()}, f"{folder}/w.pt")


if __name__ == "__main__":
    main()
