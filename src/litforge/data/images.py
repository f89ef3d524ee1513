"""Encoded image files to uint8 tensors (TorchCodec; PIL for what it does not read), the same way
for every datamodule that reads them; the whole-batch augmentation of data in memory
(`BatchAugment`). Training's per-image random transforms (torchvision's) are seeded per sample
by (run seed, epoch, place in the epoch): the same images for any number of workers, and after
a resume. Batches stay uint8 until the training device (`normalize`): a quarter of the bytes to
move. No Lightning imports: `optimize`'s worker processes import this module."""

import contextlib
import functools
import io
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# What the scan of a folder counts as an image; other files (README.txt, .DS_Store) are ignored.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
AUTO_AUGMENTS = {"randaugment": "RandAugment", "trivialaugment": "TrivialAugmentWide"}
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "nearest-exact")  # torchvision's, for tensors
# More pixels than this and a file is refused before it is decoded: a few MB of PNG can unpack
# into gigabytes. Pillow's own limit (`Image.MAX_IMAGE_PIXELS`), about 9,460 x 9,460.
MAX_IMAGE_PIXELS = 89_478_485
# The largest `data.image_size` (and image size a checkpoint may name): a batch of 64 RGB images
# of 4096 px is 3 GB as uint8 and 13 GB as float32; larger sizes exhaust memory before anything
# else is checked.
MAX_IMAGE_SIZE = 4096


class BadImageError(ValueError):
    """The bytes are no image that TorchCodec or PIL can decode."""


def decode(data: bytes, channels: int | None, max_pixels: int = MAX_IMAGE_PIXELS) -> torch.Tensor:
    """uint8 C×H×W; `channels` 1 or 3 converts, None keeps what the file has (alpha dropped).
    BadImageError for bytes that are no image, or an image of more than `max_pixels` pixels."""
    check_header(data, max_pixels)
    if data[:4] == b"GIF8":  # TorchCodec decodes every frame (a small file, many pixels)
        image = _decode_with_pil(data, channels)
    else:
        try:
            image = _decode_with_torchcodec(data, channels)
        except (RuntimeError, ValueError):  # a format it does not read (BMP, TIFF), broken bytes
            image = _decode_with_pil(data, channels)
    if image.shape[0] in (2, 4):  # gray or color with alpha
        image = image[: image.shape[0] - 1]
    return image


def header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the file's header, nothing decoded; None for a format Pillow does not
    know (TorchCodec may). PNG's is read directly: ~1 us against Pillow's ~12."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])  # IHDR is always the first chunk
    from PIL import Image

    try:
        with warnings.catch_warnings():  # what it warns of is checked against our own limit
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                return image.size
    except Image.DecompressionBombError as err:  # Pillow refuses twice its limit on opening
        raise BadImageError(str(err).split(",")[0]) from None
    except Exception:  # not a format Pillow knows, or broken: decoding says which
        return None


def check_header(data: bytes, max_pixels: int) -> None:
    """BadImageError for an empty file, or one whose header announces more than `max_pixels`
    pixels: what is refused before decoding."""
    if not data:
        raise BadImageError("an empty file (0 bytes)")
    _pillow_allows(max_pixels)
    if (size := header_size(data)) and size[0] * size[1] > max_pixels:
        raise BadImageError(
            f"{size[0]}x{size[1]} pixels, more than the {max_pixels:,} that max_image_pixels "
            f"allows: not decoded"
        )


@functools.cache
def _pillow_allows(max_pixels: int) -> None:
    """Pillow refuses to open images of twice its own limit (`Image.MAX_IMAGE_PIXELS`): a higher
    `max_pixels` raises that limit too (it is checked first, here)."""
    from PIL import Image

    if Image.MAX_IMAGE_PIXELS is not None and max_pixels > Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = max_pixels


def _decode_with_torchcodec(data: bytes, channels: int | None) -> torch.Tensor:
    from torchcodec.decoders import ImageReadMode, decode_image

    modes = {1: ImageReadMode.GRAY, 3: ImageReadMode.RGB, None: ImageReadMode.UNCHANGED}
    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return decode_image(encoded, mode=modes[channels])


def _decode_with_pil(data: bytes, channels: int | None) -> torch.Tensor:
    from PIL import Image
    from torchvision.transforms.v2.functional import pil_to_tensor

    try:
        with Image.open(io.BytesIO(data)) as opened:
            if channels is None:
                channels = 1 if opened.mode in ("1", "L", "LA", "I", "I;16", "F") else 3
            return pil_to_tensor(opened.convert("L" if channels == 1 else "RGB"))
    except Image.UnidentifiedImageError:
        raise BadImageError("not an image TorchCodec or PIL can read") from None
    except Exception as err:  # PIL raises many types for broken files; each means "not an image"
        raise BadImageError(str(err) or type(err).__name__) from None


def fit(image: torch.Tensor, size: int, interpolation: str = "bilinear") -> torch.Tensor:
    from torchvision.transforms.v2 import functional as F

    height, width = image.shape[-2:]
    if (height, width) == (size, size):
        return image
    if min(height, width) != size:
        image = F.resize(image, size, F.InterpolationMode(interpolation), antialias=True)
    return F.center_crop(image, [size, size])


@dataclass(frozen=True)
class SampleTransform:
    """File bytes (or uint8 pixels) → uint8 `channels`×`size`×`size`; picklable, for workers."""

    channels: int
    size: int
    train: bool = False
    crop_scale: tuple[float, float] | None = None
    horizontal_flip: bool = False
    seed: int = 0
    auto_augment: str | None = None  # a key of AUTO_AUGMENTS
    interpolation: str = "bilinear"  # of every resize
    max_pixels: int = MAX_IMAGE_PIXELS  # larger files are not decoded

    @functools.cached_property
    def augment(self):  # torchvision's, or None: nothing random to do
        from torchvision.transforms import v2

        steps = [v2.RandomHorizontalFlip()] if self.horizontal_flip else []
        if self.auto_augment is not None:
            steps.append(getattr(v2, AUTO_AUGMENTS[self.auto_augment])())
        if self.crop_scale is not None:
            mode = v2.InterpolationMode(self.interpolation)
            steps.insert(0, v2.RandomResizedCrop(self.size, self.crop_scale, interpolation=mode))
        return v2.Compose(steps) if self.train and steps else None

    def __call__(self, data: bytes | torch.Tensor, key: int, epoch: int) -> torch.Tensor:
        """`key`: the sample's place in the epoch (an image drawn twice gets two crops)."""
        if isinstance(data, torch.Tensor):
            image = data
        else:
            image = decode(data, self.channels, self.max_pixels)
        if self.augment is None or self.crop_scale is None:
            image = fit(image, self.size, self.interpolation)
        if self.augment is None:
            return image
        with seeded(self.seed, epoch, key):
            return self.augment(image)


def seed_of(*key: int) -> int:
    """A generator seed from `key` alone: Python hashes tuples of ints alike in every process."""
    return hash(key) & (2**63 - 1)


@contextlib.contextmanager
def seeded(*key: int):
    """The global generator (torchvision's transforms draw from it, and dropout) forked, seeded
    by `key` alone."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed_of(*key))
        yield


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    scaled = images.to(torch.float32, copy=True).div_(255)  # (one new tensor: the input stays)
    return scaled.sub_(mean.view(1, -1, 1, 1)).div_(std.view(1, -1, 1, 1))


def channel_stats(images: list[torch.Tensor]) -> tuple[list[float], list[float]]:
    pixels = torch.cat([image.flatten(1) for image in images], dim=1).double() / 255
    std = pixels.std(dim=1).clamp_min(1e-3)  # a blank channel must not divide by zero
    return [round(v, 4) for v in pixels.mean(dim=1).tolist()], [round(v, 4) for v in std.tolist()]


class BatchAugment:
    """Train-time augmentation of a batch of normalized images: pad by `crop_padding` black
    pixels, crop back at a random offset per image; mirror half of them with `horizontal_flip`."""

    def __init__(self, crop_padding: int, horizontal_flip: bool, black: Sequence[float]) -> None:
        self.crop_padding, self.horizontal_flip = crop_padding, horizontal_flip
        self.black = torch.as_tensor(black, dtype=torch.float32).view(1, -1, 1, 1)

    def draw(self, n: int, device: torch.device, generator: torch.Generator):
        offsets = flips = None
        if self.crop_padding > 0:
            size = 2 * self.crop_padding + 1
            offsets = torch.randint(0, size, (2, n, 1), generator=generator, device=device)
        if self.horizontal_flip:
            flips = torch.rand(n, generator=generator, device=device) < 0.5
        return offsets, flips

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        n, c, h, w = x.shape
        offsets, flips = self.draw(n, x.device, generator)
        if offsets is not None:
            p = self.crop_padding
            padded = self.black.to(x.device, x.dtype).expand(n, c, h + 2 * p, w + 2 * p).clone()
            padded[:, :, p : p + h, p : p + w] = x
            dy, dx = offsets
            rows = (dy + torch.arange(h, device=x.device))[:, None, :, None]  # n×1×h×1
            cols = (dx + torch.arange(w, device=x.device))[:, None, None, :]  # n×1×1×w
            batch = torch.arange(n, device=x.device)[:, None, None, None]
            channel = torch.arange(c, device=x.device)[None, :, None, None]
            x = padded[batch, channel, rows, cols]
        if flips is not None:
            x = torch.where(flips[:, None, None, None], x.flip(3), x)
        return x
