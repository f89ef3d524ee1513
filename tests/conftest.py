import fcntl
import os
import shutil
from pathlib import Path

import pytest
from helpers import NO_FASHION_MNIST, fashion_mnist_dir, run_in_process, write_idx_dataset
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig


@pytest.fixture(autouse=True)
def _clean_hydra():
    yield
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None


@pytest.fixture
def idx_data_dir(tmp_path: Path) -> Path:
    """A data dir holding small MNIST-format files as `mnist/` and `fashion_mnist/`."""
    data_dir = tmp_path / "data"
    write_idx_dataset(data_dir / "mnist", gz=True)
    write_idx_dataset(data_dir / "fashion_mnist", gz=False)
    return data_dir


@pytest.fixture(scope="session")
def fashion_mnist_folder(tmp_path_factory) -> Path:
    """The real Fashion-MNIST written out as an image folder by `export-images` (~30 s), or a
    skip when the dataset is not installed. Once per session: the test workers share it (the
    first to need it writes it, under a lock the others wait on)."""
    if fashion_mnist_dir() is None:
        pytest.skip(NO_FASHION_MNIST)
    if "PYTEST_XDIST_WORKER" not in os.environ:  # -n 0: this process is the session
        shared = tmp_path_factory.mktemp("fashion")
    else:  # the folder this session's workers have theirs in
        shared = tmp_path_factory.getbasetemp().parent
    folder, done = shared / "fashion_mnist_images", shared / "fashion_mnist_images.done"
    with (shared / "fashion_mnist_images.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # an interrupted earlier attempt
            command = ["-m", "litforge.data", "export-images", "fashion_mnist", str(folder)]
            result = run_in_process(*command)
            assert result.returncode == 0, result.stderr[-3000:]
            done.touch()
    return folder


@pytest.fixture(scope="session")
def trained_images(tmp_path_factory):
    """A small CNN trained on an image folder of 3 classes (20×24 PNG and JPEG files, fitted to
    20×20), for the tests of predict, export and serve: `root` (the folder), `checkpoint` (the
    best one, which the run tested) and `probabilities` (N×3: what the model gave each test
    image during that test, in `test_files` order)."""
    from types import SimpleNamespace

    import torch
    from helpers import compose_config, write_image_folder

    from litforge.pipeline import train

    tmp = tmp_path_factory.mktemp("trained_images")
    counts = {"a": 30, "b": 30, "c": 30}
    root = write_image_folder(tmp / "images", {"train": counts, "test": dict.fromkeys(counts, 8)})
    record = tmp / "probabilities.pt"
    overrides = [
        "data=image_folder",
        f"data.root={root}",
        "data.num_workers=0",
        "model=cnn",
        "model.net.channels=[8]",
        "model.net.hidden_size=16",
        "trainer.max_epochs=3",
        "trainer.accelerator=cpu",  # the probabilities are compared with CPU runs
        "logger=none",
        "callbacks.rich_progress_bar=null",
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


@pytest.fixture
def launched(monkeypatch):
    """Set the environment a launcher gives its processes."""
    from helpers import LAUNCHER_VARIABLES

    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def launch(**variables: str) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return launch
