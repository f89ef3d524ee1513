"""Where dataset files are looked for, in order, and the error when no source has them."""

import socket

import pytest
from helpers import write_idx_dataset

from litforge.data.fashion_mnist import FASHION_MNIST
from litforge.data.mnist import MNIST
from litforge.data.sources import DatasetNotFoundError, locate


@pytest.fixture
def no_network(monkeypatch):
    """Every connection attempt fails, as on a machine without internet."""

    def refuse(*args, **kwargs):
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_data_dir_comes_first(tmp_path):
    data_dir, system_dir = tmp_path / "data", tmp_path / "system"
    write_idx_dataset(data_dir / "fashion_mnist", n_train=10, n_test=10)
    write_idx_dataset(system_dir / "fashion-mnist", n_train=10, n_test=10, gz=True)
    assert locate(FASHION_MNIST, data_dir, system_dir) == data_dir / "fashion_mnist"


def test_system_dir_uses_the_debian_name(tmp_path, no_network):
    system_dir = tmp_path / "system"
    write_idx_dataset(system_dir / "fashion-mnist", n_train=10, n_test=10, gz=True)
    found = locate(FASHION_MNIST, tmp_path / "data", system_dir)
    assert found == system_dir / "fashion-mnist"


def test_torchvision_layout_in_data_dir_is_found(tmp_path, no_network):
    write_idx_dataset(tmp_path / "data" / "MNIST" / "raw", n_train=10, n_test=10, gz=True)
    assert locate(MNIST, tmp_path / "data", None) == tmp_path / "data" / "MNIST" / "raw"


def test_incomplete_directory_is_skipped(tmp_path, no_network):
    data_dir, system_dir = tmp_path / "data", tmp_path / "system"
    write_idx_dataset(data_dir / "fashion_mnist", n_train=10, n_test=10)
    (data_dir / "fashion_mnist" / "t10k-labels-idx1-ubyte").unlink()
    write_idx_dataset(system_dir / "fashion-mnist", n_train=10, n_test=10)
    assert locate(FASHION_MNIST, data_dir, system_dir) == system_dir / "fashion-mnist"


def test_no_source_lists_every_place_and_the_fixes(tmp_path, no_network):
    data_dir, system_dir = tmp_path / "data", tmp_path / "system"
    with pytest.raises(DatasetNotFoundError) as caught:
        locate(FASHION_MNIST, data_dir, system_dir)
    message = str(caught.value)
    assert message.startswith("dataset 'fashion_mnist' not found")
    for place in (
        data_dir / "fashion_mnist",
        data_dir / "FashionMNIST/raw",
        system_dir / "fashion-mnist",
    ):
        assert f"  - {place}\n" in message
    assert "download: http://fashion-mnist" in message and "network disabled" in message
    assert "sudo apt-get install -y dataset-fashion-mnist" in message
    assert "python -m litforge.data fetch fashion_mnist" in message
    assert not data_dir.exists(), "a failed download must leave no directories behind"


def test_download_disabled_is_said(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"download: download disabled"):
        locate(MNIST, tmp_path, None, allow_download=False)


def test_a_given_folder_holding_the_files_itself_is_used(tmp_path, no_network):
    given, system_dir = tmp_path / "my_mnist", tmp_path / "system"
    write_idx_dataset(given, n_train=10, n_test=10)
    write_idx_dataset(system_dir / "mnist", n_train=10, n_test=10)
    assert locate(MNIST, given, system_dir, given=True) == given
    # ... or a <name>/ in it, as the search root has it
    write_idx_dataset(tmp_path / "root" / "mnist", n_train=10, n_test=10)
    assert locate(MNIST, tmp_path / "root", None, given=True) == tmp_path / "root" / "mnist"


def test_a_given_folder_without_the_files_is_refused_never_swapped(tmp_path, no_network):
    given, system_dir = tmp_path / "empty", tmp_path / "system"
    given.mkdir()
    write_idx_dataset(system_dir / "fashion-mnist", n_train=10, n_test=10)  # another copy
    with pytest.raises(DatasetNotFoundError) as caught:
        locate(FASHION_MNIST, given, system_dir, allow_download=False, given=True)
    first, *rest = str(caught.value).splitlines()
    assert first.startswith(f"dataset 'fashion_mnist' not found in the given folder {given}.")
    assert not any(str(system_dir) in line for line in rest)
