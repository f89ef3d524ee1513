"""`plots/mistakes.png`: the test images most confidently wrong, read back by index."""

import types

import pytest
import torch
from helpers import (
    NO_FASHION_MNIST,
    compose_config,
    fashion_mnist_dir,
    free_port,
    run_script,
    write_image_folder,
)

from litforge.pipeline import train
from litforge.plots.mistakes import Mistakes, dataset_indices

PNG = b"\x89PNG\r\n\x1a\n"


def one_process() -> types.SimpleNamespace:
    return types.SimpleNamespace(strategy=types.SimpleNamespace(all_gather=lambda t: t))


def test_the_most_confident_mistakes_are_kept_across_batches_with_their_test_set_indices():
    found = Mistakes(3, torch.device("cpu"))
    first = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.3, 0.7], [0.6, 0.4]])  # positions 0-3
    found.update(first.log(), torch.tensor([1, 0, 0, 1]))  # wrong: 0 (.5), 2 (.7), 3 (.6)
    second = torch.tensor([[0.9, 0.1], [0.01, 0.99], [float("nan"), 0.0]])  # positions 4-6
    found.update(second.log(), torch.tensor([0, 0, 1]))  # wrong: 5 (.99); 6: NaN, not shown
    indices = [10, 11, 12, 13, 14, 15, 16]  # this process's share: test-set index by position
    rows = found.gathered(one_process(), indices)
    assert [(i, y, p) for i, y, p, _ in rows] == [(15, 0, 1), (12, 0, 1), (13, 1, 0)]
    assert [round(c, 2) for *_, c in rows] == [0.99, 0.7, 0.6]


def test_no_mistake_gives_no_rows_and_a_sampler_of_tuples_gives_indices():
    found = Mistakes(4, torch.device("cpu"))
    found.update(torch.tensor([[3.0, 0.0]]), torch.tensor([0]))
    assert found.gathered(one_process(), None) == []
    sampler = types.SimpleNamespace(sampler=[(4, 4, 0), (2, 2, 0)])  # image folders': tuples
    assert dataset_indices(types.SimpleNamespace(batch_sampler=sampler)) == [4, 2]


def test_an_rgb_image_folder_run_draws_its_mistakes(tmp_path):
    counts = {"train": {"cat": 24, "dog": 24}, "test": {"cat": 8, "dog": 8}}
    root = write_image_folder(tmp_path / "photos", counts, (128, 160))
    test = root / "test"  # the test set's labels swapped: every test image a confident mistake
    (test / "cat").rename(test / "x")
    (test / "dog").rename(test / "cat")
    (test / "x").rename(test / "dog")
    data = ["data=image_folder", f"data.root={root}", "data.image_size=128", "data.num_workers=2"]
    run = ["data.batch_size=8", "logger=none", "trainer.max_epochs=2"]
    metrics = train(compose_config("train", tmp_path, [*data, *run]))
    assert metrics["test/acc"] < 0.5
    drawn = (tmp_path / "run" / "plots" / "mistakes.png").read_bytes()
    assert drawn.startswith(PNG) and len(drawn) > 5_000


@pytest.mark.slow
@pytest.mark.skipif(fashion_mnist_dir() is None, reason=NO_FASHION_MNIST)
def test_fashion_mnist_on_two_processes_draws_the_mistakes_of_both(tmp_path):
    result = run_script(
        "train.py",
        "data=fashion_mnist",
        f"paths.data_dir={fashion_mnist_dir()}",
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=20",
        "logger=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        env={"MASTER_PORT": str(free_port())},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    drawn = (tmp_path / "run" / "plots" / "mistakes.png").read_bytes()
    assert drawn.startswith(PNG) and len(drawn) > 5_000


def test_images_of_a_dataset_of_yours_are_drawn_whatever_their_type(tmp_path):
    from PIL import Image

    from litforge.plots import figures
    from litforge.plots.mistakes import images

    dataset = [
        (torch.rand(3, 40, 30) * 2 - 1, 0),  # normalized floats
        (Image.new("RGB", (30, 40), "red"), 1),  # a PIL image
        (torch.zeros(40, 30, dtype=torch.uint8), 0),  # H×W
    ]
    loader = types.SimpleNamespace(dataset=dataset)
    read = images(loader, [(0, 0, 1, 0.9), (1, 1, 0, 0.8), (2, 0, 1, 0.7)])
    assert [(tuple(i.shape), i.dtype) for i in read] == [((3, 40, 30), torch.uint8)] * 2 + [
        ((1, 40, 30), torch.uint8)
    ]
    figures.mistakes(read, ["a\nb"] * 3, tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes().startswith(PNG)
