"""The test images the model got most confidently wrong: `plots/mistakes.png`. During the test,
each process keeps on its device the `count` most confident mistakes it has seen (their
positions in its share of the test set, no copy to the host per batch); at the end rank 0 reads
only those images back from the test set by index (memory, files or streamed shards; not an
iterable dataset of yours, whose samples carry no index)."""

from typing import Any

import lightning as L
import numpy as np
import torch

from litforge.hooks import KeepsTestIndices  # feature: streaming


class Mistakes:
    """The mistakes of one process's test batches: per batch three small tensors kept on the
    device (each image's top log-probability where it is a mistake, -inf elsewhere; the
    prediction; the label); the `count` most confident chosen once, at the end."""

    def __init__(self, count: int, device: torch.device) -> None:
        self.count, self.device = count, device
        self.batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        # Four small operations a batch: the top log-probability and class, kept where wrong.
        top, prediction = logits.detach().float().log_softmax(dim=1).max(dim=1)
        self.batches.append(
            (torch.where(prediction != labels, top, -torch.inf), prediction, labels)
        )

    def chosen(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(confidence, position, label, prediction) of the `count` most confident, padded
        with confidence -1 (all processes gather the same shapes)."""
        pad = torch.full((self.count,), -torch.inf, device=self.device)
        zeros = torch.zeros(self.count, dtype=torch.long, device=self.device)
        found = torch.cat([pad, *(b[0] for b in self.batches)])
        found = found.masked_fill(found.isnan(), -torch.inf)  # (of non-finite logits: none)
        prediction = torch.cat([zeros, *(b[1] for b in self.batches)])
        label = torch.cat([zeros, *(b[2] for b in self.batches)])
        top = found.topk(self.count).indices
        position = (top - self.count).clamp(min=0)  # (the padding's: no mistake, dropped)
        kept = found[top]
        confidence = torch.where(kept > -torch.inf, kept.exp(), -1.0)  # top softmax probability
        return confidence, position, label[top], prediction[top]

    def gathered(self, trainer: L.Trainer, indices: list[int] | None) -> list[tuple]:
        """Every process's mistakes, most confident first, on the host: (test-set index, label,
        prediction, confidence). `indices`: this process's test-set index of each position."""
        confidence, index, label, prediction = self.chosen()
        if indices is not None:
            # (A process that saw no test image: its slots are padding, dropped after the gather.)
            known = torch.tensor(indices or [0], device=index.device)
            index = known[index.clamp(max=len(known) - 1)]
        mine = torch.stack([index, label, prediction]).double()
        together = trainer.strategy.all_gather(torch.cat([mine, confidence[None].double()]))
        rows = together.reshape(-1, 4, self.count).transpose(1, 2).reshape(-1, 4).cpu()
        rows = rows[rows[:, 3] >= 0]  # (slots no mistake filled)
        rows = rows[rows[:, 3].argsort(descending=True)][: self.count]
        return [(int(i), int(y), int(p), float(c)) for i, y, p, c in rows.tolist()]


def readable(trainer: L.Trainer, loader: Any) -> bool:
    """Whether the test images can be read back by index: a map-style dataset (its sampler says
    the order), or one whose datamodule keeps the indices it streamed."""
    if isinstance(trainer.datamodule, KeepsTestIndices):  # feature: streaming
        return True
    return not isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset)


def test_indices(trainer: L.Trainer, loader: Any) -> list[int] | None:
    """The test-set index of each position in this process's share, or None where the loader
    does not say."""
    if isinstance(trainer.datamodule, KeepsTestIndices):  # feature: streaming
        kept = trainer.datamodule.test_indices
        return torch.cat(kept).tolist() if kept else []
    return dataset_indices(loader)


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
    """The test images at the rows' indices, as the test read them, as uint8 C×H×W (a float
    image of a dataset of yours: stretched to 0-255; a PIL image: converted)."""
    found = []
    for index, *_ in rows:
        image = loader.dataset[index][0]
        image = image if isinstance(image, torch.Tensor) else torch.from_numpy(np.array(image))
        if image.ndim == 2:
            image = image.unsqueeze(0)
        elif image.shape[-1] in (1, 3) and image.shape[0] not in (1, 3):  # H×W×C (a PIL image)
            image = image.permute(2, 0, 1)
        if image.dtype != torch.uint8:
            image = image.float()
            low, high = image.min(), image.max()
            image = ((image - low) / (high - low).clamp(min=1e-12) * 255).round().to(torch.uint8)
        found.append(image)
    return found
