from pathlib import Path

import pytest
from helpers import NO_FASHION_MNIST, ROOT, fashion_mnist_dir, run_script, write_idx_dataset
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
    """The real Fashion-MNIST written out as an image folder by `export-images` (once per
    session: ~30 s), or a skip when the dataset is not installed."""
    if fashion_mnist_dir() is None:
        pytest.skip(NO_FASHION_MNIST)
    folder = tmp_path_factory.mktemp("fashion") / "images"
    command = ["-m", "litforge.data", "export-images", "fashion_mnist", str(folder)]
    result = run_script(*command, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder
