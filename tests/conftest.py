from pathlib import Path

import pytest
from helpers import write_idx_dataset
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
