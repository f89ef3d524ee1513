"""Which samples each process reads (torch's DistributedSampler, seeded per epoch), and the batch
augmentation of data in memory."""

import itertools

import pytest
import torch
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from litforge.data.base import TensorImages, as_batch
from litforge.data.images import BatchAugment
from litforge.data.samplers import EpochSampler, evaluation_sampler


@pytest.mark.parametrize(("n", "replicas"), [(10, 3), (12, 4), (7, 2)])
def test_shards_are_distributed_samplers_seeded_by_the_run(n, replicas):
    for epoch in (0, 1):
        for rank in range(replicas):
            ours = EpochSampler(n, num_replicas=replicas, rank=rank, seed=5)
            theirs = DistributedSampler(range(n), num_replicas=replicas, rank=rank, seed=5)
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_shards_cover_the_epoch_and_change_with_it():
    def shards(epoch):
        out = []
        for rank in range(2):
            sampler = EpochSampler(9, num_replicas=2, rank=rank, seed=0)
            sampler.set_epoch(epoch)
            out.append(list(sampler))
        return out

    first, second = shards(0)
    assert len(first) == len(second) == 5  # padded to equal length
    assert set(first) | set(second) == set(range(9))
    assert shards(0) == [first, second] and shards(1) != [first, second]


def test_keys_number_the_epochs_samples_over_all_processes():
    keyed = [EpochSampler(9, num_replicas=2, rank=r, seed=1, keyed=True) for r in (0, 1)]
    for sampler in keyed:
        sampler.set_epoch(3)
    items = [item for sampler in keyed for item in sampler]
    plain = [EpochSampler(9, num_replicas=2, rank=r, seed=1) for r in (0, 1)]
    for sampler in plain:
        sampler.set_epoch(3)
    assert [index for index, _, _ in items] == [i for sampler in plain for i in sampler]
    assert sorted(key for _, key, _ in items) == list(range(10)) and {e for *_, e in items} == {3}


def test_weights_draw_a_rare_class_as_often_as_a_common_one():
    labels = torch.tensor([0] * 900 + [1] * 100)
    weights = 1 / torch.bincount(labels)[labels].double()
    sampler = EpochSampler(1000, seed=0, weights=weights)
    drawn = labels[list(sampler)]
    assert 400 < int((drawn == 1).sum()) < 600
    sampler.set_epoch(1)
    assert labels[list(sampler)].tolist() != drawn.tolist()  # another draw each epoch


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loaders_checkpointed_state_resumes_mid_epoch_or_with_the_next_epoch(workers):
    """In Lightning's order: a resumed loader's state loaded, the loader read from (workers read
    ahead), then the epoch set; a state saved after a whole epoch starts the next one."""
    images, labels = torch.arange(40).view(40, 1, 1, 1), torch.arange(40)

    def loader():
        sampler = EpochSampler(40, seed=2)
        dataset = torch.utils.data.TensorDataset(images, labels)
        return StatefulDataLoader(dataset, batch_size=4, sampler=sampler, num_workers=workers)

    def epoch(n, state=None, stop=None):
        run = loader()
        if state is None:  # an epoch that is no resume: its epoch set first
            run.sampler.set_epoch(n)
        else:
            run.load_state_dict(state)
        iterator = iter(run)
        run.sampler.set_epoch(n)
        taken = [y.tolist() for _, y in itertools.islice(iterator, stop)]
        return taken, run.state_dict()

    whole, _ = epoch(3)
    first, state = epoch(3, stop=3)
    rest, _ = epoch(3, state)
    assert first + rest == whole
    _, after_whole = epoch(3, stop=10)  # every batch handed out, the loader not yet exhausted
    assert epoch(4, after_whole)[0] == epoch(4)[0] != whole
    if workers == 0:  # an epoch cut short (trainer.limit_train_batches): the next starts whole
        assert epoch(4, state)[0] == epoch(4)[0]


def test_evaluation_shards_are_uneven_and_disjoint():
    parts = [evaluation_sampler(9, num_replicas=2, rank=r) for r in (0, 1)]
    assert [list(p) for p in parts] == [[0, 2, 4, 6, 8], [1, 3, 5, 7]]
    assert [len(p) for p in parts] == [5, 4]


def test_a_batch_of_data_in_memory_is_one_gather_through_torchs_dataloader():
    images = torch.randint(0, 256, (10, 1, 4, 4), dtype=torch.uint8)
    labels = torch.arange(10)
    loader = torch.utils.data.DataLoader(
        TensorImages(images, labels), batch_size=4, sampler=evaluation_sampler(10),
        collate_fn=as_batch,
    )  # fmt: skip
    batches = list(loader)
    assert [len(y) for _, y in batches] == [4, 4, 2]
    assert torch.equal(torch.cat([x for x, _ in batches]), images)
    assert torch.equal(torch.cat([y for _, y in batches]), labels)


def test_random_crop_shifts_content_and_pads_with_black():
    x = torch.arange(2 * 8 * 8, dtype=torch.float32).view(1, 2, 8, 8).repeat(64, 1, 1, 1)
    augment = BatchAugment(crop_padding=2, horizontal_flip=False, black=[-1.0, -2.0])
    out = augment(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    shifted = [not torch.equal(o, x[0]) for o in out]
    assert 0 < sum(shifted) < 64  # some images moved, some (offset 2,2) did not
    # padding shows up as each channel's black value, nothing else is invented
    for c, black in enumerate((-1.0, -2.0)):
        values = set(out[:, c].unique().tolist())
        assert values <= set(x[0, c].unique().tolist()) | {black}


def test_horizontal_flip_mirrors_about_half():
    x = torch.randn(200, 3, 5, 5)
    out = BatchAugment(0, True, [0.0] * 3)(x, torch.Generator().manual_seed(0))
    flipped = [torch.equal(o, i.flip(2)) for o, i in zip(out, x, strict=True)]
    unchanged = [torch.equal(o, i) for o, i in zip(out, x, strict=True)]
    assert all(f or u for f, u in zip(flipped, unchanged, strict=True))
    assert 70 < sum(flipped) < 130


def test_batch_augmentation_resumes_mid_epoch_through_the_datamodule_state():
    # data.mix seeds each batch by its place in the epoch, which the datamodule counts and
    # Lightning checkpoints (its state_dict): a run resumed mid-epoch blends as if uninterrupted.
    from types import SimpleNamespace

    from litforge.data.mnist import MNISTDataModule

    def datamodule(**settings):
        dm = MNISTDataModule(seed=3, **settings)
        dm.trainer = SimpleNamespace(training=True, current_epoch=1, global_rank=0)
        return dm

    batches = [(torch.rand(4, 1, 28, 28), torch.arange(4)) for _ in range(4)]
    whole = datamodule(mix="mixup", crop_padding=2)
    expected = [whole.on_after_batch_transfer(b, 0)[0] for b in batches]
    first = datamodule(mix="mixup", crop_padding=2)
    for b in batches[:2]:
        first.on_after_batch_transfer(b, 0)
    resumed = datamodule(mix="mixup", crop_padding=2)
    resumed.load_state_dict(first.state_dict())
    for b, want in zip(batches[2:], expected[2:], strict=True):
        torch.testing.assert_close(resumed.on_after_batch_transfer(b, 0)[0], want)
    resumed.trainer.current_epoch = 2  # a new epoch counts from its first batch
    assert resumed.on_after_batch_transfer(batches[0], 0) is not None
    assert resumed.state_dict() == {"epoch": 2, "batches": 1, "next_epoch": 0}  # (no loader)
    plain = datamodule()
    plain.on_after_batch_transfer(batches[0], 0)
    # Nothing drawn, nothing counted.
    assert plain.state_dict() == {"epoch": -1, "batches": 0, "next_epoch": 0}
