"""Encoded images to uint8 tensors (`litforge.data.images`), on files in real formats."""

import io
import re
import struct
import warnings

import numpy as np
import pytest
import torch
from helpers import png_bomb
from PIL import Image

from litforge.data.images import (
    BadImageError,
    SampleTransform,
    decode,
    fit,
    image_size,
    normalize,
)


def encoded(array: np.ndarray, fmt: str, **kwargs) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format=fmt, **kwargs)
    return out.getvalue()


RGB = np.random.default_rng(0).integers(0, 256, (12, 16, 3)).astype(np.uint8)


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "WEBP", "TIFF"])
def test_lossless_formats_decode_to_the_exact_pixels(fmt):
    kwargs = {"lossless": True} if fmt == "WEBP" else {}
    image = decode(encoded(RGB, fmt, **kwargs), channels=3)
    assert image.dtype == torch.uint8 and image.shape == (3, 12, 16)
    assert torch.equal(image, torch.from_numpy(RGB).permute(2, 0, 1))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP", "GIF"])
def test_decoding_warns_of_nothing(fmt):
    """TorchCodec decodes (torchvision's decoders are deprecated): no warning, none silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert decode(encoded(RGB, fmt), channels=3).shape == (3, 12, 16)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "BMP", "WEBP"])
def test_channels_convert_to_those_asked_for(fmt):
    gray = RGB[:, :, 0]
    as_rgb = decode(encoded(gray, fmt), 3)
    assert as_rgb.shape == (3, 12, 16) and torch.equal(as_rgb[0], as_rgb[2])
    assert decode(encoded(RGB, fmt), 1).shape == (1, 12, 16)
    if fmt != "JPEG":
        rgba = np.dstack([RGB, np.full((12, 16), 255, np.uint8)])
        assert torch.equal(decode(encoded(rgba, fmt), 3), decode(encoded(RGB, fmt), 3))


def test_gifs_decode_to_the_channels_asked_for_and_their_first_frame():
    gray = RGB[:, :, 0]
    still = encoded(gray, "GIF")
    assert decode(still, 1).shape == (1, 12, 16)
    assert decode(still, 3).shape == (3, 12, 16)
    frames = [Image.fromarray(RGB), Image.fromarray(255 - RGB)]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:])
    animated = out.getvalue()
    assert decode(animated, 3).shape == (3, 12, 16)
    assert decode(animated, 1).shape == (1, 12, 16)


def test_broken_bytes_are_a_bad_image():
    png = encoded(RGB, "PNG")
    # The last: a PNG cut off inside its header (which the pixel count reads).
    for data in (b"not an image at all", png[: len(png) // 2], png[:20]):
        with pytest.raises(BadImageError):
            decode(data, 3)


def test_an_empty_file_is_a_bad_image():
    with pytest.raises(BadImageError, match=r"an empty file \(0 bytes\)"):
        decode(b"", 3)


def bmp_header(width: int, height: int) -> bytes:
    """A 24-bit BMP's headers, without the pixels they announce."""
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 54 + 3 * width * height, 0, 0, 54) + info


@pytest.mark.parametrize(
    ("data", "max_pixels", "message"),
    [
        # ~100 KB that unpack into 100 MB.
        (png_bomb(10_000, 10_000), None, "10000x10000 pixels, more than the 89,478,485"),
        (encoded(RGB, "JPEG"), 100, "16x12 pixels, more than the 100 that"),  # Pillow's
        # Beyond twice Pillow's own limit, Pillow refuses to open it at all.
        (bmp_header(30_000, 30_000), None, "Image size (900000000 pixels) exceeds limit"),
    ],
)
def test_an_image_of_too_many_pixels_is_refused_before_decoding(
    monkeypatch, data, max_pixels, message
):
    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded")

    monkeypatch.setattr("torchcodec.decoders.decode_image", no_decoding)
    monkeypatch.setattr("PIL.Image.Image.load", no_decoding)
    limit = {} if max_pixels is None else {"max_pixels": max_pixels}
    with pytest.raises(BadImageError, match=re.escape(message)):
        decode(data, 3, **limit)


def test_an_animated_gif_decodes_its_first_frame_alone(monkeypatch):
    """TorchCodec would decode every frame: 100 frames of a few KB unpack into 100 images."""
    frames = [Image.fromarray(np.full((12, 16, 3), 2 * i, np.uint8)) for i in range(100)]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:])

    def no_decoding(*args, **kwargs):
        raise AssertionError("TorchCodec decoded the GIF")

    monkeypatch.setattr("torchcodec.decoders.decode_image", no_decoding)
    assert decode(out.getvalue(), 3).shape == (3, 12, 16)


def test_a_limit_above_pillows_own_is_honoured(monkeypatch):
    """Pillow refuses to open twice its limit (178,956,970 pixels): a higher setting raises it."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # put back after
    header = bmp_header(14_000, 14_000)  # 196 million pixels
    with pytest.raises(BadImageError, match="14000x14000 pixels, more than the 150,000,000"):
        image_size(header, 150_000_000)
    assert image_size(header, 200_000_000) == (14_000, 14_000)


def test_fit_resizes_the_shorter_side_and_keeps_the_center():
    image = torch.zeros(3, 40, 80, dtype=torch.uint8)
    image[:, :, 20:60] = 200  # the central 40 columns
    fitted = fit(image, 20)
    assert fitted.shape == (3, 20, 20) and fitted.dtype == torch.uint8
    assert int(fitted[..., 1:-1].min()) == 200  # only the center is left (edges antialiased)
    same = torch.randint(0, 255, (1, 20, 20), dtype=torch.uint8)
    assert fit(same, 20) is same


def test_training_crops_are_seeded_per_sample_and_epoch():
    data = encoded(RGB, "PNG")
    train = SampleTransform(3, 8, train=True, crop_scale=(0.3, 0.6), horizontal_flip=True, seed=1)
    a = train(data, key=5, epoch=0)
    assert a.shape == (3, 8, 8)
    assert torch.equal(a, train(data, key=5, epoch=0))  # any worker, any resume: the same
    others = [train(data, key=5, epoch=e) for e in range(1, 6)]
    assert any(not torch.equal(a, b) for b in others)  # a new crop each epoch
    evaluation = SampleTransform(3, 8)
    assert torch.equal(evaluation(data, 5, 0), evaluation(data, 5, 3))


@pytest.mark.parametrize("policy", ["randaugment", "trivialaugment"])
@pytest.mark.parametrize("channels", [1, 3])
def test_auto_augment_is_seeded_per_sample_and_only_for_training(policy, channels):
    photo = np.random.default_rng(1).integers(0, 256, (144, 176, 3)).astype(np.uint8)
    data = encoded(photo, "PNG")
    train = SampleTransform(channels, 128, train=True, auto_augment=policy, seed=1)
    state = torch.get_rng_state()
    a = train(data, key=5, epoch=2)
    assert torch.equal(torch.get_rng_state(), state)  # dropout's generator: left as it was
    assert a.shape == (channels, 128, 128) and a.dtype == torch.uint8
    assert torch.equal(a, train(data, key=5, epoch=2))
    assert any(not torch.equal(a, train(data, key=k, epoch=2)) for k in range(6, 12))
    evaluation = SampleTransform(channels, 128, auto_augment=policy)
    assert torch.equal(evaluation(data, 5, 2), fit(decode(data, channels), 128))


def test_the_interpolation_is_that_of_the_resize():
    data = encoded(np.random.default_rng(2).integers(0, 256, (160, 200, 3)).astype(np.uint8), "PNG")
    resized = {
        m: SampleTransform(3, 128, interpolation=m)(data, 0, 0) for m in ("bilinear", "nearest")
    }
    assert not torch.equal(resized["bilinear"], resized["nearest"])
    rows = torch.arange(128) * 160 // 128  # nearest: every pixel one of the original ones
    cols = (torch.arange(128) + 16) * 200 // 160  # the central 128 of 160
    original = decode(data, 3)
    assert torch.equal(resized["nearest"], original[:, rows][:, :, cols])


def test_normalization_scales_to_0_1_then_standardizes():
    images = torch.randint(0, 256, (20, 3, 10, 10), dtype=torch.uint8)
    scaled = images.double() / 255
    mean, std = scaled.mean(dim=(0, 2, 3)), scaled.std(dim=(0, 2, 3))
    batch = normalize(images, mean.float(), std.float())
    assert batch.dtype == torch.float32
    assert torch.allclose(batch.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-3)
    assert torch.allclose(batch.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-2)
