"""The test images the model got most confidently wrong: `plots/mistakes.png`. During the test,
each process keeps on its device the `count` most confident mistakes it has seen (their
positions in its share of the test set, no copy to the host per batch); at the end rank 0 reads
only those images back from the test set by index (memory or files; not an iterable dataset's
stream, whose samples carry no index)."""

from typing import Any

import lightning as L
import torch


class Mistakes:
    """The most confident mistakes of one process's test batches, by position in its share."""

    def __init__(self, count: int, device: torch.device) -> None:
        self.count = count
        self.confidence = torch.full((count,), -1.0, device=device)  # -1: none yet
        self.position = torch.zeros(count, dtype=torch.long, device=device)
        self.label = torch.zeros(count, dtype=torch.long, device=device)
        self.prediction = torch.zeros(count, dtype=torch.long, device=device)
        self.seen = 0  # positions so far (host ints: batch sizes are known there)

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        probabilities = logits.detach().float().softmax(dim=1)
        confidence, prediction = probabilities.max(dim=1)
        wrong = (prediction != labels) & confidence.isfinite()  # (a NaN: no mistake to show)
        confidence = torch.where(wrong, confidence, -1.0)
        n = len(labels)
        position = torch.arange(self.seen, self.seen + n, device=labels.device)
        self.seen += n
        pool = [
            torch.cat([self.confidence, confidence]),
            torch.cat([self.position, position]),
            torch.cat([self.label, labels]),
            torch.cat([self.prediction, prediction]),
        ]
        top = pool[0].topk(self.count).indices
        self.confidence, self.position, self.label, self.prediction = (t[top] for t in pool)

    def gathered(self, trainer: L.Trainer, indices: list[int] | None) -> list[tuple]:
        """Every process's mistakes, most confident first, on the host: (test-set index, label,
        prediction, confidence). `indices`: this process's test-set index of each position."""
        index = self.position
        if indices is not None:
            index = torch.tensor(indices, device=index.device)[index.clamp(max=len(indices) - 1)]
        mine = torch.stack([index, self.label, self.prediction]).double()
        together = trainer.strategy.all_gather(torch.cat([mine, self.confidence[None].double()]))
        rows = together.reshape(-1, 4, self.count).transpose(1, 2).reshape(-1, 4).cpu()
        rows = rows[rows[:, 3] >= 0]  # (slots no mistake filled)
        rows = rows[rows[:, 3].argsort(descending=True)][: self.count]
        return [(int(i), int(y), int(p), float(c)) for i, y, p, c in rows.tolist()]


def dataset_indices(loader: Any) -> list[int] | None:
    """The test-set index of each position in this process's share (its loader's sampler), or
    None where the loader does not say."""
    sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    sampler = sampler if sampler is not None else getattr(loader, "sampler", None)
    if sampler is None:
        return None
    return [item[0] if isinstance(item, tuple) else int(item) for item in sampler]  # (image
    # folders' samplers give (index, key, epoch))


def images(loader: Any, rows: list[tuple]) -> list[torch.Tensor]:
    """The test images at the rows' indices, as the test read them (uint8, C×H×W)."""
    return [loader.dataset[index][0] for index, *_ in rows]
