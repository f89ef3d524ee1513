"""A Lightning script as Lightning's docs write it, started cold: the floor `epoch_time.py`
measures `python train.py`'s fixed cost against. It imports Lightning, reads Fashion-MNIST's IDX
files into a `DataLoader`, and fits the default MLP for `--steps` training batches and one
validation batch with the Trainer's defaults (its logger, checkpoint and progress bar), then
exits. No config, no datamodule.

    python benchmarks/bare_lightning_run.py --steps 1 --data /usr/share/datasets/fashion-mnist
"""

import argparse
import tempfile
from pathlib import Path

import lightning as L
import torch
from handwritten_run import read_idx
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(784, 512),
            nn.BatchNorm1d(512),
            nn.ReLU(),
            nn.Linear(512, 256),
            nn.BatchNorm1d(256),
            nn.ReLU(),
            nn.Linear(256, 10),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        accuracy = (self.net(x).argmax(dim=1) == y).float().mean()
        self.log("val_acc", accuracy)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=1e-4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, required=True, help="folder of the IDX files (or gzipped)"
    )
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()

    images = read_idx(args.data / "train-images-idx3-ubyte", 16).reshape(-1, 1, 28, 28)
    labels = torch.from_numpy(read_idx(args.data / "train-labels-idx1-ubyte", 8).astype("int64"))
    x = (torch.from_numpy(images.copy()).float() / 255 - 0.286) / 0.353
    train = DataLoader(TensorDataset(x[:55_000], labels[:55_000]), batch_size=256, shuffle=True)
    val = DataLoader(TensorDataset(x[55_000:], labels[55_000:]), batch_size=256)
    L.seed_everything(0)
    with tempfile.TemporaryDirectory() as folder:
        trainer = L.Trainer(
            max_epochs=1,
            limit_train_batches=args.steps,
            limit_val_batches=1,
            default_root_dir=folder,
        )
        trainer.fit(Classifier(), train, val)


if __name__ == "__main__":
    main()
