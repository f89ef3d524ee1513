"""litforge/streaming/samples.py: what `python -m litforge.streaming optimize` does per file."""

import io

import numpy as np
import pytest
from helpers import png_bomb
from PIL import Image

from litforge.data.images import BadImageError
from litforge.streaming.samples import check_decodes, shard_sample

RGB = np.random.default_rng(0).integers(0, 256, (12, 16, 3)).astype(np.uint8)


def encoded(array: np.ndarray, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format=fmt)
    return out.getvalue()


def test_broken_bytes_are_a_bad_image():
    png = encoded(RGB, "PNG")
    # Broken, cut off, empty, and 100 MB of pixels in ~100 KB (not decoded: refused by its header)
    for data in (b"not an image at all", png[: len(png) // 2], b"", png_bomb(10_000, 10_000)):
        with pytest.raises(BadImageError):
            check_decodes(data)
    check_decodes(png)  # a good one passes
    with pytest.raises(BadImageError, match="16x12 pixels, more than the 100 that"):
        check_decodes(png, max_pixels=100)  # optimize --max-image-pixels 100


def test_shard_sample_keeps_the_bytes_and_reports_bad_files(tmp_path):
    good, bad = tmp_path / "good.png", tmp_path / "bad.jpg"
    good.write_bytes(encoded(RGB, "PNG"))
    bad.write_bytes(b"\xff\xd8 truncated jpeg")
    reports = tmp_path / "reports"
    reports.mkdir()
    assert shard_sample((str(good), 4), str(reports)) == {"image": good.read_bytes(), "label": 4}
    assert shard_sample((str(bad), 1), str(reports)) is None
    [report] = reports.iterdir()
    assert str(bad) in report.read_text()
