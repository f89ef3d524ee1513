"""Which samples each process reads in an epoch: torch's `DistributedSampler`, given `num_replicas`
and `rank` (1 and 0 in one process, where it needs no process group), so Lightning replaces no
sampler of ours and calls `set_epoch` on it before every epoch, resumed ones included. (Our
loaders set the first one already when built: `DataModule.training_epoch`.)"""

import itertools

import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DistributedSampler


class EpochSampler(DistributedSampler):
    """Training: one permutation per epoch seeded by `seed` and the epoch, the same on every
    process, padded to equal shards. With `weights` (one per sample), a draw with replacement in
    proportion to them: class-balanced sampling. `keyed`: each index comes as (index, key,
    epoch), `key` its place in the epoch over all processes, which seeds the sample's random
    transforms (the same ones for any number of workers, and after a resume)."""

    def __init__(
        self,
        num_samples: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        weights: torch.Tensor | None = None,
        keyed: bool = False,
    ) -> None:
        super().__init__(range(num_samples), num_replicas=num_replicas, rank=rank, seed=seed)
        self.weights, self.keyed = weights, keyed
        self.yielded = 0
        self.resume = (-1, 0)  # (epoch, samples to skip in it) from a checkpoint

    def __iter__(self):
        if self.weights is None:
            indices = list(super().__iter__())
        else:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            drawn = torch.multinomial(self.weights, self.total_size, True, generator=generator)
            indices = drawn[self.rank :: self.num_replicas].tolist()
        if self.keyed:
            first = self.rank * self.num_samples  # keys unique over processes
            indices = [(index, first + k, self.epoch) for k, index in enumerate(indices)]
        (epoch, skip), self.resume = self.resume, (-1, 0)
        self.yielded = skip if epoch == self.epoch else 0  # (not when a new epoch was set)
        for item in itertools.islice(indices, self.yielded, None):
            self.yielded += 1
            yield item

    # Where an epoch stopped, for torchdata's `StatefulDataLoader` (which Lightning checkpoints):
    # a resumed run goes on with the next sample of the same epoch, or, after a whole epoch, with
    # the next epoch. (Lightning sets the epoch after the loader has started to read ahead.)
    def state_dict(self) -> dict[str, int]:
        if self.yielded >= self.num_samples:
            return {"epoch": self.epoch + 1, "yielded": 0}
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.epoch = state_dict["epoch"]  # (until Lightning sets it: workers may read before)
        self.resume = (state_dict["epoch"], state_dict["yielded"])


def evaluation_sampler(num_samples: int, num_replicas: int = 1, rank: int = 0):
    """In order; under several processes, uneven shards: no sample is counted twice."""
    dataset = range(num_samples)
    return UnrepeatedDistributedSampler(dataset, num_replicas, rank, shuffle=False)
