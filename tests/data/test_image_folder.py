"""`data=image_folder`: real PNG and JPEG files in the `root/<split>/<class>/<image>` layout."""

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import (
    band_image,
    compose_config,
    png_bomb,
    run_in_process,
    train_recording_samples,
    write_image_folder,
    write_numbered_folder,
)
from omegaconf import OmegaConf

from litforge.checks import check_config
from litforge.data.base import DataModule, model_arguments
from litforge.data.image_folder import IMAGENET_MEAN, IMAGENET_STD, ImageFolderDataModule
from litforge.data.images import decode, fit
from litforge.errors import UserError
from litforge.pipeline import data_from_checkpoint, train

CLASSES = ("cat", "dog", "fox")


def folder(tmp_path, train=20, test=None, **kwargs):
    counts = {"train": dict.fromkeys(CLASSES, train)}
    if test:
        counts["test"] = dict.fromkeys(CLASSES, test)
    return write_image_folder(tmp_path / "images", counts, **kwargs)


def batches_of(dm, loader) -> list:
    """The loader's batches as the model gets them before the device (bad files handled)."""
    return [dm.on_before_batch_transfer(batch, 0) for batch in loader]


def photos(root, sizes=(128,), per_class=12):
    """`root/<class>/<n>.png|.jpg`, the flat layout: RGB `band_image`s, sizes×(sizes + 16)
    pixels, each size in turn."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            size = sizes[i % len(sizes)]
            image = Image.fromarray(band_image(label, rng, (size, size + 16)))
            image.save(root / name / f"{i:04d}.{'jpg' if i % 2 else 'png'}", quality=95)
    return root


def make(root, **kwargs):
    kwargs.setdefault("num_workers", 0)
    kwargs.setdefault("image_size", 20)  # `folder`'s 20×24 images, shorter side
    return ImageFolderDataModule(root=str(root), **kwargs)


def test_classes_shape_and_carved_splits(tmp_path):
    dm = make(folder(tmp_path, train=20), val_fraction=0.2, test_fraction=0.1)
    arguments = model_arguments(dm)
    assert arguments["class_names"] == CLASSES
    assert arguments["input_shape"] == (3, 20, 20)  # 20×24 images: shorter side, center
    counts = {s: [len(dm.splits[s][c]) for c in CLASSES] for s in ("train", "val", "test")}
    assert counts == {"train": [14] * 3, "val": [4] * 3, "test": [2] * 3}  # stratified
    files = [set(p for c in CLASSES for p in dm.splits[s][c]) for s in ("train", "val", "test")]
    assert not (files[0] & files[1] or files[0] & files[2] or files[1] & files[2])
    again = make(dm.hparams.root, val_fraction=0.2, test_fraction=0.1)
    again.inspect()
    assert again.splits == dm.splits  # seeded: the same carve every run
    other = make(dm.hparams.root, val_fraction=0.2, test_fraction=0.1, split_seed=1)
    other.inspect()
    assert other.splits["val"] != dm.splits["val"]


def test_hidden_files_are_ignored_and_a_missing_split_is_named(tmp_path):
    root = folder(tmp_path, train=5)
    (root / "train" / "cat" / "._0000.png").write_bytes(b"macOS metadata, not an image")
    dm = make(root, val_fraction=0)
    dm.inspect()
    assert sum(map(len, dm.splits["train"].values())) == 15  # no ._ file; 10% of 5 rounds to 0
    with pytest.raises(UserError, match="no val images.*data.val_fraction=0"):
        dm.setup("fit")


def test_a_test_folder_is_used_as_it_is(tmp_path):
    dm = make(folder(tmp_path, train=10, test=3))
    dm.inspect()
    assert [len(dm.splits["test"][c]) for c in CLASSES] == [3, 3, 3]
    assert [len(dm.splits["val"][c]) for c in CLASSES] == [1, 1, 1]  # carved: 10% of 10


def test_null_settings_are_what_imagenet_pretrained_networks_take(tmp_path):
    root = folder(tmp_path, color=False)
    dm = make(root, image_size=None)
    dm.inspect()  # grayscale files, converted to RGB
    assert (dm.channels, dm.image_size, dm.mean, dm.std) == (3, 224, IMAGENET_MEAN, IMAGENET_STD)
    gray = make(root, channels=1)
    gray.inspect()
    assert (gray.mean, gray.std) == ([0.449], [0.226])  # ImageNet's averaged
    one_value = make(root, mean=[0.5], std=[0.2])
    one_value.inspect()
    assert one_value.channels == 1  # null: as many as data.mean has
    given = make(root, channels=3, mean=[0.5] * 3, std=[0.2] * 3)
    given.inspect()
    assert (given.channels, given.mean, given.std) == (3, [0.5] * 3, [0.2] * 3)
    # (a count that fits no channels: tests/test_errors.py, before anything is read)


def test_batches_are_uint8_until_normalized_on_the_device(tmp_path):
    dm = make(folder(tmp_path, train=20), batch_size=8, image_size=16)
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = batches_of(dm, loader)
    assert len(batches) == len(loader) == 6  # 3 × (20 - 2 val - 2 test) images
    images, labels = batches[0]
    assert images.dtype == torch.uint8 and images.shape == (8, 3, 16, 16)
    assert sorted(set(torch.cat([b[1] for b in batches]).tolist())) == [0, 1, 2]
    x, y = dm.on_after_batch_transfer((images, labels), 0)
    assert x.dtype == torch.float32 and torch.equal(y, labels)
    mean = torch.tensor(dm.mean).view(1, -1, 1, 1)
    std = torch.tensor(dm.std).view(1, -1, 1, 1)
    torch.testing.assert_close(x, (images.float() / 255 - mean) / std)


def test_worker_processes_give_the_same_batches(tmp_path):
    root = folder(tmp_path, train=12)
    batches = {}
    for workers in (0, 2):
        augment = {"crop_scale": [0.5, 1], "horizontal_flip": True}
        dm = make(root, batch_size=5, num_workers=workers, **augment)
        dm.setup("fit")
        batches[workers] = batches_of(dm, dm.train_dataloader())
    for (a, la), (b, lb) in zip(batches[0], batches[2], strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_the_runs_seed_orders_and_augments_the_epochs(tmp_path, monkeypatch):
    # From the config (`data.seed: ${seed}`), not from Lightning's PL_GLOBAL_SEED.
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    root = folder(tmp_path, train=12)
    cfg = compose_config("train", tmp_path, ["data=image_folder", f"data.root={root}", "seed=3"])
    assert cfg.data.seed == 3
    dm = make(root, seed=3, crop_scale=[0.5, 1])
    dm.setup("fit")
    assert dm.train_dataloader().sampler.seed == 3
    assert dm.sample_transform(train=True).seed == 3
    unseeded = make(root, seed=None)  # seed=null
    unseeded.setup("fit")
    assert unseeded.sample_transform(train=True).seed == 0


def test_the_loader_resumes_mid_epoch_with_the_next_batch(tmp_path):
    dm = make(folder(tmp_path, train=12), batch_size=4, crop_scale=[0.5, 1])
    dm.setup("fit")
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(3)
    everything = batches_of(dm, loader)
    stopped = dm.train_dataloader()
    stopped.sampler.set_epoch(3)
    iterator = iter(stopped)
    next(iterator), next(iterator)
    state = stopped.state_dict()  # what Lightning checkpoints (a StatefulDataLoader's)
    resumed = dm.train_dataloader()
    resumed.load_state_dict(state)
    iterator = iter(resumed)  # as Lightning does: the loader reads ahead, then the epoch is set
    resumed.sampler.set_epoch(3)
    rest = batches_of(dm, iterator)
    assert len(rest) == len(everything) - 2
    for (a, la), (b, lb) in zip(rest, everything[2:], strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_a_training_loader_starts_at_the_epoch_the_trainer_is_at(tmp_path):
    # Its workers read ahead before Lightning sets the epoch: a run resumed from an epoch's end
    # (no loader state to restore) read epoch 0's samples again. The whole run: test_resume.py.
    dm = make(folder(tmp_path, train=12), batch_size=4, crop_scale=[0.5, 1], num_workers=2)
    dm.setup("fit")
    reference = dm.train_dataloader()
    reference.sampler.set_epoch(3)
    expected = batches_of(dm, reference)
    cpu = SimpleNamespace(root_device=torch.device("cpu"))
    dm.trainer = SimpleNamespace(current_epoch=3, distributed_sampler_kwargs=None, strategy=cpu)
    loader = dm.train_dataloader()
    iterator = iter(loader)  # as Lightning does: the workers read ahead, then the epoch is set
    loader.sampler.set_epoch(3)
    for (a, la), (b, lb) in zip(batches_of(dm, iterator), expected, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_processes_share_out_each_epoch(tmp_path):
    root = folder(tmp_path, train=9)
    seen = []
    for rank in range(2):
        dm = make(root, batch_size=4)
        dm.setup("fit")
        shard = {"num_replicas": 2, "rank": rank}
        dm.trainer = SimpleNamespace(
            distributed_sampler_kwargs=shard,
            strategy=SimpleNamespace(root_device=torch.device("cpu")),
            current_epoch=0,
        )
        seen.append([index for index, _, _ in dm.train_dataloader().sampler])
    assert len(seen[0]) == len(seen[1]) == 11  # 3 × 7 training images, evened out by one
    assert set(seen[0]) | set(seen[1]) == set(range(21))


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        ("missing", "is no folder"),
        ("no_train", "has no train/ folder"),
        ("no_images", "holds no images"),
        ("empty_class", "class folder"),
        ("unknown_class", "has classes the train split lacks: zebra"),
        ("stray_image", "images outside class folders"),
        ("mixed_layout", "holds train/ and other folders beside it \\(owl, ...\\)"),
        ("too_few", "class 'cat' has 1 training image"),
        ("one_class", "has one class folder, .*train/cat: a classifier needs two or more"),
    ],
)
def test_a_folder_that_cannot_work_is_one_clear_error_before_training(tmp_path, layout, words):
    root = tmp_path / "images"
    if layout != "missing":
        root.mkdir()
    if layout not in ("missing", "no_train"):
        (root / "train").mkdir()
    if layout == "no_train":
        write_image_folder(root, {"val": {"cat": 1}})
    if layout in ("empty_class", "unknown_class", "stray_image", "mixed_layout"):
        write_image_folder(root, {"train": {"cat": 2, "dog": 2}})
    if layout == "empty_class":
        (root / "train" / "owl").mkdir()
    if layout == "unknown_class":
        write_image_folder(root, {"val": {"cat": 1, "zebra": 1}})
    if layout == "stray_image":
        (root / "train" / "cat" / "0000.png").rename(root / "train" / "loose.png")
    if layout == "one_class":
        write_image_folder(root, {"train": {"cat": 3}})
    if layout == "mixed_layout":  # a class folder beside train/
        write_image_folder(root, {".": {"owl": 1}})
    if layout == "too_few":  # 10% of one image rounds to none, 60% to one: none left
        write_image_folder(root, {"train": {"cat": 1, "dog": 4}})
        with pytest.raises(UserError, match=words):
            model_arguments(make(root, val_fraction=0.6, test_fraction=0.1))
        return
    with pytest.raises(UserError, match=words):
        model_arguments(make(root))


BAD_FILES = {  # the bytes, what the log says of them
    "broken": (b"\xff\xd8\xff not really a jpeg", "not an image Pillow can read"),
    "empty": (b"", "an empty file (0 bytes)"),
    "bomb": (png_bomb(10_000, 10_000), "10000x10000 pixels, more than the 89,478,485"),
}


@pytest.mark.parametrize("kind", BAD_FILES)
@pytest.mark.parametrize("on_bad_file", ["error", "skip"])
def test_a_file_that_does_not_decode_stops_the_run_or_is_skipped(
    tmp_path, caplog, on_bad_file, kind
):
    root = folder(tmp_path, train=10)
    # Statistics from one good file: the bad one is met when loading (as in a large folder).
    settings = {"batch_size": 100, "val_fraction": 0, "test_fraction": 0}
    make(root, **settings).inspect()  # statistics cached while every file is good
    bad = root / "train" / "dog" / "0003.jpg"
    data, reason = BAD_FILES[kind]
    bad.write_bytes(data)
    dm = make(root, on_bad_file=on_bad_file, **settings)
    dm.inspect()  # (no validation images to set up)
    loader = dm.train_dataloader()
    if on_bad_file == "error":
        with pytest.raises(UserError, match=f"cannot decode {bad}.*data.on_bad_file=skip"):
            batches_of(dm, loader)
    else:
        for epoch in range(2):  # a second epoch too: workers meet it again
            dm.trainer = SimpleNamespace(current_epoch=epoch)
            [(images, labels)] = batches_of(dm, loader)
            assert len(images) == len(labels) == 29 and dm.skipped == (epoch, 1)
        assert f"Left out {bad} ({reason}" in caplog.text and "(1 this epoch" in caplog.text


def test_balance_by_sampler_or_loss(tmp_path):
    root = write_image_folder(tmp_path / "images", {"train": {"common": 40, "rare": 4}})
    sampled = make(root, balance="sampler", val_fraction=0, test_fraction=0, batch_size=44)
    sampled.inspect()
    loader = sampled.train_dataloader()
    labels = []
    for epoch in range(5):
        loader.sampler.set_epoch(epoch)
        labels += [y for _, y in batches_of(sampled, loader)]
    assert 0.4 < torch.cat(labels).float().mean() < 0.6  # rare drawn about as often as common
    weighted = make(root, balance="loss", val_fraction=0, test_fraction=0)
    assert model_arguments(weighted)["class_weights"] == pytest.approx([0.55, 5.5])
    assert "class_weights" not in model_arguments(make(root))


def refused(tmp_path, *settings: str) -> str:
    """The line a run with these `data.*` settings stops with, before any image is read."""
    given = [f"+data.{s[1:]}" if s[0] == "+" else f"data.{s}" for s in settings]
    overrides = ["data=image_folder", "data.root=/nonexistent", *given]
    with pytest.raises(UserError) as error:
        check_config(compose_config("train", tmp_path, overrides))
    return str(error.value)


def test_bad_settings_name_their_key(tmp_path):
    for settings, line in [
        (["val_fraction=0.6", "test_fraction=0.5"], "data.val_fraction=0.6 and data.test_fraction"),
        (["val_fraction=1"], "data.val_fraction=1: must be < 1."),
        (["channels=2"], "data.channels=2: must be one of: 1, 3, or null."),
        (["crop_scale=[0.9,0.2]"], "data.crop_scale=[0.9,0.2]: the first (smallest share"),
        (["crop_scale=[0,1]"], "data.crop_scale=[0,1]: each value must be > 0."),
        (["mean=[0.5]"], "data.mean and data.std go together: give both or neither."),
        (["on_bad_file=ignore"], "data.on_bad_file=ignore: must be one of: error, skip."),
        (["balance=oversample"], "data.balance=oversample: must be one of: none, sampler, loss."),
        (["num_workers=-1"], "data.num_workers=-1: must be >= 0."),
        (["max_image_pixels=0"], "data.max_image_pixels=0: must be > 0."),
        (["mix_alpha=0"], "data.mix_alpha=0: must be > 0."),
        (["horizontal_flip=maybe"], "data.horizontal_flip=maybe: must be true or false."),
        (["+crop_scales=[0.5,1]"], "data.crop_scales: litforge.data.image_folder.Image"),
    ]:
        assert refused(tmp_path, *settings).startswith(line), settings
    assert "(did you mean data.crop_scale?)" in refused(tmp_path, "+crop_scales=[0.5,1]")


def test_train_then_eval_reads_the_same_folder(tmp_path):
    root = folder(tmp_path, train=30, test=6)
    overrides = [
        "data=image_folder",
        f"data.root={root}",
        "data.image_size=20",
        "data.num_workers=0",
        "data.batch_size=16",
        "trainer.max_epochs=3",
        "trainer.accelerator=cpu",
        "callbacks.rich_progress_bar=null",
    ]
    metrics = train(compose_config("train", tmp_path, overrides))
    assert metrics["test/acc"] >= 0.9  # the bands are easy
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    result = run_in_process(
        "eval.py",
        *overrides,
        f"ckpt_path={checkpoint}",
        f"hydra.run.dir={tmp_path / 'eval'}",
        "extras.print_config=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert evaluated["test/acc"] == pytest.approx(metrics["test/acc"], abs=1e-6)
    other = write_image_folder(tmp_path / "other", {"train": {"cat": 2, "dog": 2, "owl": 2}})
    result = run_in_process("eval.py", *overrides, f"data.root={other}", f"ckpt_path={checkpoint}")
    assert result.returncode == 1
    assert "was trained on other classes (cat, dog, fox) than the data has (cat, dog, owl)" in (
        result.stderr
    )


@pytest.mark.slow
def test_two_processes_train_on_every_sample_once_per_epoch(tmp_path):
    source = write_numbered_folder(tmp_path / "images", 120)  # 96 to train, 24 to validate
    per_rank = train_recording_samples(
        tmp_path,
        "data=image_folder",
        f"data.root={source}",
        "data.image_size=8",
        "data.channels=1",
        "data.val_fraction=0.2",
        "data.test_fraction=0",
        "data.num_workers=1",
    )
    for epoch in (0, 1):
        a, b = per_rank[(epoch, 0)], per_rank[(epoch, 1)]
        assert len(a) == len(b) == 48  # the same number of steps on both
        assert len(a + b) == len(set(a + b)) == 96  # every training sample exactly once
    assert per_rank[(0, 0)] != per_rank[(1, 0)]  # reshuffled each epoch


@pytest.mark.slow
def test_mlp_reaches_85_percent_on_exported_fashion_mnist(tmp_path, fashion_mnist_folder):
    # The same class of accuracy as the IDX files give (tests/data/test_fashion_mnist.py).
    cfg = compose_config(
        "train",
        tmp_path,
        [
            "data=image_folder",
            f"data.root={fashion_mnist_folder}",
            "data.image_size=28",
            "data.channels=1",
            "data.batch_size=256",
            "trainer.max_epochs=2",
            "callbacks.rich_progress_bar=null",
        ],
    )
    metrics = train(cfg)
    assert metrics["test/acc"] >= 0.85


@pytest.mark.slow
def test_balancing_raises_the_recall_of_a_rare_class(tmp_path, fashion_mnist_folder):
    # Shirts are easily taken for T-shirts; with 30 shirts to 1500 T-shirts a plain run
    # rarely predicts "Shirt" at all.
    root = tmp_path / "imbalanced"
    for split, take in (("train", {"T-shirt_top": 1500, "Shirt": 30}), ("test", None)):
        for name in ("T-shirt_top", "Shirt"):
            files = sorted((fashion_mnist_folder / split / name).iterdir())
            (root / split / name).mkdir(parents=True)
            for path in files[: take[name] if take else 500]:
                os.link(path, root / split / name / path.name)
    recall = {}
    for balance in ("none", "sampler", "loss"):
        matrix_file = tmp_path / f"{balance}.json"
        overrides = [
            "data=image_folder",
            f"data.root={root}",
            "data.image_size=28",
            "data.channels=1",
            f"data.balance={balance}",
            "data.num_workers=0",
            "trainer.max_epochs=4",
            "callbacks.rich_progress_bar=null",
            "+callbacks.confusion._target_=helpers.RecordConfusion",
            f"+callbacks.confusion.path={matrix_file}",
        ]
        train(compose_config("train", tmp_path / balance, overrides))
        matrix = json.loads(matrix_file.read_text())  # classes sorted: Shirt, T-shirt_top
        recall[balance] = matrix[0][0] / sum(matrix[0])
    print("recall of the rare class:", recall)
    assert recall["sampler"] > recall["none"] + 0.2, recall
    assert recall["loss"] > recall["none"] + 0.2, recall


def test_given_statistics_and_crop_go_into_checkpoints_as_plain_values(tmp_path):
    # From the command line they are OmegaConf lists: a checkpoint holding one would not load
    # with weights_only=True (eval.py, resuming).
    root = folder(tmp_path, train=6, test=2)
    overrides = [
        "data=image_folder", f"data.root={root}", "data.num_workers=0", "trainer.max_epochs=1",
        "data.image_size=20", "data.mean=[0.5,0.5,0.5]", "data.std=[0.25,0.25,0.25]",
        "data.crop_scale=[0.5,1]",
        "logger=none", "callbacks.rich_progress_bar=null",
    ]  # fmt: skip
    train(compose_config("train", tmp_path, overrides))
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["datamodule_hyper_parameters"]["mean"] == [0.5, 0.5, 0.5]


def test_a_flat_folder_is_carved_into_three_splits_seeded_and_stratified(tmp_path):
    root = photos(tmp_path / "flat", per_class=20)
    dm = make(root, val_fraction=0.2, test_fraction=0.1, image_size=128)
    assert model_arguments(dm)["input_shape"] == (3, 128, 128)
    counts = {s: [len(dm.splits[s][c]) for c in CLASSES] for s in ("train", "val", "test")}
    assert counts == {"train": [14] * 3, "val": [4] * 3, "test": [2] * 3}  # every class in each
    files = [{p for c in CLASSES for p in dm.splits[s][c]} for s in ("train", "val", "test")]
    assert sum(map(len, files)) == len(set.union(*files)) == 60  # disjoint, all of them
    again = make(root, val_fraction=0.2, test_fraction=0.1)
    again.inspect()
    assert again.splits == dm.splits  # seeded
    # the same carve as from a train/ folder of the same files
    nested = tmp_path / "nested"
    (nested / "train").mkdir(parents=True)
    for c in CLASSES:
        (nested / "train" / c).symlink_to(root / c)
    layered = make(nested, val_fraction=0.2, test_fraction=0.1)
    layered.inspect()
    names = {s: {c: [p.name for p in f] for c, f in dm.splits[s].items()} for s in dm.splits}
    assert names == {
        s: {c: [p.name for p in f] for c, f in layered.splits[s].items()} for s in layered.splits
    }


def test_images_of_mixed_sizes_train_at_one_size(tmp_path):
    root = photos(tmp_path / "photos", sizes=(128, 144, 160), per_class=6)
    overrides = [
        "data=image_folder", f"data.root={root}", "data.num_workers=0", "data.batch_size=8",
        "model=mlp", "model.net.hidden_sizes=[8]", "trainer.max_epochs=1",
        "trainer.accelerator=cpu", "logger=none", "callbacks.rich_progress_bar=null",
    ]  # fmt: skip
    train(compose_config("train", tmp_path, overrides))
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["input_shape"] == [3, 224, 224]  # null: 224
    dm = make(root, image_size=96, batch_size=64)
    dm.setup("fit")
    images, _, _ = next(iter(dm.train_dataloader()))
    assert images.shape[1:] == (3, 96, 96)


def test_the_interpolation_is_that_of_every_resize_and_comes_from_checkpoints(tmp_path):
    root = photos(tmp_path / "photos", sizes=(160,), per_class=10)
    dm = make(root, image_size=128, interpolation="nearest", crop_scale=[0.5, 1], batch_size=64)
    dm.setup("fit")
    images, _, _ = next(iter(dm.val_dataloader()))
    first = sorted(p for c in CLASSES[:1] for p in dm.splits["val"][c])[0]
    decoded = decode(first.read_bytes(), 3)
    assert torch.equal(images[0], fit(decoded, 128, "nearest"))
    assert not torch.equal(images[0], fit(decoded, 128, "bilinear"))
    crop = dm.sample_transform(train=True).augment.transforms[0]
    assert crop.interpolation.value == "nearest"
    assert make(root).hparams.interpolation == "bilinear"  # null: bilinear
    cfg = OmegaConf.create({"ckpt_path": "last.ckpt", "data": {"interpolation": None}})
    trained = {
        "hyper_parameters": {"input_shape": [3, 128, 128]},
        "datamodule_hyper_parameters": {"interpolation": "bicubic"},
    }
    data_from_checkpoint(cfg, trained)  # eval.py
    assert cfg.data.interpolation == "bicubic"
    cfg.data.interpolation = "nearest"
    with pytest.raises(UserError, match="data.interpolation=nearest, but last.ckpt was trained"):
        data_from_checkpoint(cfg, trained)


def test_auto_augment_changes_training_images_only(tmp_path):
    root = photos(tmp_path / "photos", per_class=10)
    batches = {}
    for policy in (None, "randaugment", "trivialaugment"):
        dm = make(root, auto_augment=policy, batch_size=64)
        dm.setup("fit")
        batches[policy] = [next(iter(dm.train_dataloader()))[0], next(iter(dm.val_dataloader()))[0]]
    for policy in ("randaugment", "trivialaugment"):
        train_images, val_images = batches[policy]
        assert torch.equal(val_images, batches[None][1])
        changed = (train_images != batches[None][0]).flatten(1).any(1)
        assert changed.float().mean() > 0.5, policy  # some policies draw "identity"
    again = make(root, auto_augment="randaugment", batch_size=64)
    again.setup("fit")
    assert torch.equal(next(iter(again.train_dataloader()))[0], batches["randaugment"][0])


@pytest.mark.parametrize("data", ["image_folder", "mnist"])
def test_mix_blends_training_batches_only_and_still_learns(
    tmp_path, idx_data_dir, monkeypatch, data
):
    seen = []  # (training?, labels) of each batch on the device
    hook = DataModule.on_after_batch_transfer

    def recording(self, batch, dataloader_idx):
        batch = hook(self, batch, dataloader_idx)
        seen.append((self.trainer.training, batch[1]))
        return batch

    monkeypatch.setattr(DataModule, "on_after_batch_transfer", recording)
    if data == "mnist":  # 10 classes: band rows (helpers.learnable_images)
        settings = [f"paths.data_dir={idx_data_dir}", "data.val_size=100"]
    else:
        root = photos(tmp_path / "photos", per_class=30)
        settings = [f"data.root={root}", "data.num_workers=0"]
    overrides = [
        f"data={data}", *settings, "data.mix=both", "data.batch_size=16", "model=mlp",
        "model.net.hidden_sizes=[64]", "trainer.max_epochs=4", "trainer.accelerator=cpu",
        "logger=none", "callbacks.rich_progress_bar=null",
    ]  # fmt: skip
    metrics = train(compose_config("train", tmp_path, overrides))
    soft = [labels for training, labels in seen if training]
    hard = [labels for training, labels in seen if not training]
    assert soft and hard
    assert all(y.dtype == torch.float32 and y.ndim == 2 for y in soft)
    torch.testing.assert_close(torch.cat(soft).sum(1), torch.ones(sum(map(len, soft))))
    assert any((y.max(1).values < 0.99).any() for y in soft)  # blended, not one-hot
    assert all(y.dtype == torch.int64 and y.ndim == 1 for y in hard)  # val, test: classes
    assert metrics["test/acc"] >= 0.8, metrics  # chance: 0.1 or 1/3; 1.0 here


def test_unknown_names_are_one_line_errors(tmp_path):
    root = photos(tmp_path / "photos", per_class=2)
    for key, value, choices in [
        ("auto_augment", "autoaugment", "randaugment, trivialaugment, or null"),
        ("interpolation", "lanczos", "bilinear, bicubic, nearest, nearest-exact, or null"),
        ("mix", "mixcut", "mixup, cutmix, both, or null"),
    ]:
        line = refused(tmp_path, f"{key}={value}")
        assert line == f"data.{key}={value}: must be one of: {choices}."
    with pytest.raises(UserError, match="data.mix=blend: must be one of"):
        check_config(compose_config("train", tmp_path, ["data=mnist", "data.mix=blend"]))
    result = run_in_process(
        "train.py", "data=image_folder", f"data.root={root}", "data.auto_augment=rand",
        f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: data.auto_augment=rand: must be one of: randaugment, trivialaugment, or null."
    )


def test_k_folds_of_a_folder_partition_its_training_images_and_leave_test_alone(tmp_path):
    root = photos(tmp_path / "flat", per_class=20)  # 128 px RGB photos, three classes
    plain = make(root, test_fraction=0.1)
    plain.inspect()
    folds = []
    for fold in range(3):
        dm = make(root, test_fraction=0.1, num_folds=3, fold=fold)
        dm.inspect()
        assert dm.splits["test"] == plain.splits["test"]  # the test split as without folds
        folds.append(dm.splits)
    pool = {p for c in CLASSES for p in plain.splits["train"][c] + plain.splits["val"][c]}
    vals = [{p for c in CLASSES for p in splits["val"][c]} for splits in folds]
    assert sum(map(len, vals)) == len(set.union(*vals)) == len(pool) == 54
    assert set.union(*vals) == pool  # disjoint and covering
    for val, splits in zip(vals, folds, strict=True):
        assert {p for c in CLASSES for p in splits["train"][c]} == pool - val
        assert [len(splits["val"][c]) for c in CLASSES] == [6, 6, 6]  # 18 per class, 3 folds
