"""What the deploy tests share: a CNN trained once on RGB photos, exported once per format."""

import pytest
from hydra.core.global_hydra import GlobalHydra


@pytest.fixture(scope="session")
def trained_images(tmp_path_factory):
    """A small CNN trained on an image folder of 3 classes (20×24 PNG and JPEG files, fitted to
    20×20), for the tests of predict, export and serve: `root` (the folder), `checkpoint` (the
    best one, which the run tested) and `probabilities` (N×3: what the model gave each test
    image during that test, in `test_files` order)."""
    from types import SimpleNamespace

    import torch
    from helpers import compose_config, small_cnn_args, write_image_folder

    from litforge.pipeline import train

    tmp = tmp_path_factory.mktemp("trained_images")
    counts = {"a": 30, "b": 30, "c": 30}
    root = write_image_folder(tmp / "images", {"train": counts, "test": dict.fromkeys(counts, 8)})
    record = tmp / "probabilities.pt"
    overrides = [
        *small_cnn_args(root),
        "trainer.accelerator=cpu",  # the probabilities are compared with CPU runs
        "+callbacks.record._target_=helpers.RecordTestProbabilities",
        f"+callbacks.record.path={record}",
    ]
    metrics = train(compose_config("train", tmp / "train", overrides))
    assert metrics["test/acc"] > 0.9, "the fixture's model must have learned the classes"
    checkpoint = next((tmp / "train" / "run" / "checkpoints").glob("epoch_*.ckpt"))
    test_files = sorted((root / "test").rglob("*.*"))  # the test loader's order: class, name
    GlobalHydra.instance().clear()
    return SimpleNamespace(
        root=root,
        checkpoint=checkpoint,
        test_files=test_files,
        probabilities=torch.load(record),
        class_names=sorted(counts),
    )


def _export(tmp_path_factory, trained_images, file_format: str):
    from helpers import compose_config

    from litforge.deploy.export import export

    tmp = tmp_path_factory.mktemp(f"export_{file_format}")
    overrides = [
        f"ckpt_path={trained_images.checkpoint}",
        f"format={file_format}",
        f"export.sample_input={trained_images.root / 'test'}",
    ]
    path = export(compose_config("export", tmp, overrides))
    GlobalHydra.instance().clear()
    return path


@pytest.fixture(scope="session")
def exported_onnx(tmp_path_factory, trained_images):
    """`trained_images`' checkpoint as model.onnx (export.py, checked on its test images)."""
    return _export(tmp_path_factory, trained_images, "onnx")


@pytest.fixture(scope="session")
def exported_pt2(tmp_path_factory, trained_images):
    """`trained_images`' checkpoint as model.pt2 (export.py, checked on its test images)."""
    return _export(tmp_path_factory, trained_images, "pt2")
