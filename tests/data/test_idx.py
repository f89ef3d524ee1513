"""The IDX reader shared by MNIST and Fashion-MNIST, on files written in the real format."""

import numpy as np
import pytest
import torch
from helpers import write_idx

from litforge.data.idx import IDXFormatError, read_idx


@pytest.mark.parametrize("gz", [False, True])
def test_reads_images_and_labels_plain_or_gzipped(tmp_path, gz):
    images = np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28)
    labels = np.array([7, 0, 9], dtype=np.uint8)
    image_path = write_idx(tmp_path / "images-idx3-ubyte", images, gz)
    label_path = write_idx(tmp_path / "labels-idx1-ubyte", labels, gz)

    assert torch.equal(read_idx(image_path), torch.from_numpy(images))
    assert read_idx(label_path).tolist() == [7, 0, 9]


def test_wrong_magic_number_names_the_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(b"\x1f\x00\x08\x03" + bytes(16))
    with pytest.raises(IDXFormatError, match="not an IDX file.*bad magic number 1f000803"):
        read_idx(path)


def test_truncated_file_is_reported_with_sizes(tmp_path):
    path = write_idx(tmp_path / "x-idx3-ubyte", np.zeros((4, 28, 28), np.uint8))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(IDXFormatError, match=r"truncated or damaged"):
        read_idx(path)


def test_truncated_gzip_is_reported(tmp_path):
    path = write_idx(tmp_path / "x-idx3-ubyte", np.zeros((4, 28, 28), np.uint8), gz=True)
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(IDXFormatError, match=f"cannot read {path}"):
        read_idx(path)


def test_gz_suffix_on_a_plain_file_is_reported(tmp_path):
    path = tmp_path / "x-idx1-ubyte.gz"
    path.write_bytes(b"not gzip")
    with pytest.raises(IDXFormatError, match="cannot read"):
        read_idx(path)
