import fcntl
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import (
    NO_FASHION_MNIST,
    export_images,
    fashion_mnist_dir,
    write_idx_dataset,
)
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from litforge.data.fashion_mnist import FashionMNISTDataModule


@pytest.fixture(autouse=True)
def _clean_hydra():
    yield
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None


@pytest.fixture(autouse=True)
def _same_torch_threads():
    """Restore the worker's thread count after a test that sets it (a serving model does): the
    exact-resume tests compare in-process runs with subprocess runs, and the sums differ between
    thread counts."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def idx_data_dir(tmp_path: Path) -> Path:
    """A data root holding small MNIST-format files where torchvision reads MNIST and
    Fashion-MNIST (`MNIST/raw/`, `FashionMNIST/raw/`)."""
    data_dir = tmp_path / "data"
    write_idx_dataset(data_dir / "MNIST" / "raw")
    write_idx_dataset(data_dir / "FashionMNIST" / "raw")
    return data_dir


@pytest.fixture(scope="session")
def fashion_mnist_folder(tmp_path_factory) -> Path:
    """The real Fashion-MNIST written out as an image folder (`helpers.export_images`, ~30 s), or a
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
            export_images(FashionMNISTDataModule(root=str(fashion_mnist_dir())), folder)
            done.touch()
    return folder


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
