"""Batches from tensors on the training device: for data in memory, a per-sample `DataLoader` is
overhead. One index tensor per epoch picks each process's samples (as `DistributedSampler`), and
a batch is one gather, then whole-batch normalization and augmentation (on the GPU, if there)."""

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch


@dataclass
class EpochShuffler:
    """This process's sample indices in an epoch, as `DistributedSampler` picks them: in training,
    one permutation per epoch, the same on every process (the run's `seed`), padded by wrapping
    around; else in order, the shards uneven (no sample counted twice). Lightning calls
    `set_epoch` before each epoch, resumed runs included. `weights`: one per sample."""

    num_samples: int
    train: bool
    num_replicas: int = 1
    rank: int = 0
    seed: int = 0
    weights: torch.Tensor | None = None
    epoch: int = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.train:
            return math.ceil(self.num_samples / self.num_replicas)
        return len(range(self.rank, self.num_samples, self.num_replicas))

    def indices(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        if self.weights is not None:
            order = torch.multinomial(self.weights, self.num_samples, True, generator=generator)
        elif self.train:
            order = torch.randperm(self.num_samples, generator=generator)
        else:
            order = torch.arange(self.num_samples)
        if self.train and self.num_replicas > 1:
            total = len(self) * self.num_replicas
            order = order.repeat(math.ceil(total / self.num_samples))[:total]
        return order[self.rank :: self.num_replicas]


class BatchAugment:
    """Train-time augmentation of a batch of normalized images: pad by `crop_padding` black
    pixels, crop back at a random offset per image; mirror half of them with `horizontal_flip`."""

    def __init__(self, crop_padding: int, horizontal_flip: bool, black: Sequence[float]) -> None:
        self.crop_padding, self.horizontal_flip = crop_padding, horizontal_flip
        self.black = torch.as_tensor(black, dtype=torch.float32).view(1, -1, 1, 1)

    def draw(self, n: int, device: torch.device, generator: torch.Generator):
        offsets = flips = None
        if self.crop_padding > 0:
            size = 2 * self.crop_padding + 1
            offsets = torch.randint(0, size, (2, n, 1), generator=generator, device=device)
        if self.horizontal_flip:
            flips = torch.rand(n, generator=generator, device=device) < 0.5
        return offsets, flips

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        n, c, h, w = x.shape
        offsets, flips = self.draw(n, x.device, generator)
        if offsets is not None:
            p = self.crop_padding
            padded = self.black.to(x.device, x.dtype).expand(n, c, h + 2 * p, w + 2 * p).clone()
            padded[:, :, p : p + h, p : p + w] = x
            dy, dx = offsets
            rows = (dy + torch.arange(h, device=x.device))[:, None, :, None]  # n×1×h×1
            cols = (dx + torch.arange(w, device=x.device))[:, None, None, :]  # n×1×1×w
            batch = torch.arange(n, device=x.device)[:, None, None, None]
            channel = torch.arange(c, device=x.device)[None, :, None, None]
            x = padded[batch, channel, rows, cols]
        if flips is not None:
            x = torch.where(flips[:, None, None, None], x.flip(3), x)
        return x


class ResumesMidEpoch:
    """The loader state Lightning checkpoints: a run stopped mid-epoch goes on with the next batch
    of the same epoch. `__iter__` calls `start_epoch()`, then counts batches in `handed_out`."""

    batch_sampler = None  # Lightning calls `sampler.set_epoch`; this is no `DataLoader` to rewrap
    sampler: EpochShuffler
    handed_out = 0  # batches of the current epoch
    _resume: dict[str, int] | None = None

    def state_dict(self) -> dict[str, int]:
        # Lightning fetches no batch ahead of a sized loader: each one handed out was trained on.
        return {"epoch": self.sampler.epoch, "batches": self.handed_out}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self._resume = dict(state_dict)

    def start_epoch(self) -> int:
        """The batches of this epoch to skip: those a resumed checkpoint had trained on."""
        resume, self._resume = self._resume, None
        on_time = resume is not None and resume["epoch"] == self.sampler.epoch
        self.handed_out = resume["batches"] if on_time else 0
        return self.handed_out


class TensorBatchLoader(ResumesMidEpoch):
    """(images, labels) batches for Lightning from tensors on one device: uint8 images are
    normalized per batch (cheap on a GPU), float32 ones come normalized (cheaper on a CPU)."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        sampler: EpochShuffler,
        mean: Sequence[float],
        std: Sequence[float],
        augment: BatchAugment | None = None,
    ) -> None:
        self.images, self.labels = images, labels
        self.batch_size, self.sampler, self.augment = batch_size, sampler, augment
        self.mean = torch.tensor(mean, device=images.device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=images.device).view(1, -1, 1, 1)

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        device = self.images.device
        indices = self.sampler.indices().to(device)
        skip = self.start_epoch() * self.batch_size
        generator = None
        if self.augment is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(hash((self.sampler.seed, self.sampler.epoch, self.sampler.rank)))
            for start in range(0, skip, self.batch_size):  # the same draws
                self.augment.draw(len(indices[start : start + self.batch_size]), device, generator)
        for start in range(skip, len(self) * self.batch_size, self.batch_size):
            self.handed_out += 1
            batch = indices[start : start + self.batch_size]
            x = self.images[batch]
            if x.dtype == torch.uint8:
                x = (x.float().div_(255) - self.mean) / self.std
            if generator is not None:
                x = self.augment(x, generator)
            yield x, self.labels[batch]
