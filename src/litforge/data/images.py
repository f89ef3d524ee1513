"""Encoded image files to uint8 tensors, the same way for every datamodule that reads them
(the header read and its size checked first; TorchCodec decodes JPEG and PNG, Pillow the other
formats); the whole-batch augmentation of data in memory (`BatchAugment`). Training's per-image
random transforms (torchvision's) are seeded per sample by (run seed, epoch, place in the epoch):
the same images for any number of workers, and after a resume. Batches stay uint8 until the
training device (`normalize`): a quarter of the bytes to move. No Lightning imports: `optimize`'s
worker processes import this module."""

import contextlib
import functools
import io
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal, get_args

import torch
from annotated_types import Interval

# What the scan of a folder counts as an image; other files (README.txt, .DS_Store) are ignored.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
AUTO_AUGMENTS = {"randaugment": "RandAugment", "trivialaugment": "TrivialAugmentWide"}
Interpolation = Literal["bilinear", "bicubic", "nearest", "nearest-exact"]  # torchvision's
INTERPOLATIONS = get_args(Interpolation)
AutoAugment = Literal["randaugment", "trivialaugment"]  # keys of AUTO_AUGMENTS
# More pixels than this and a file is refused before it is decoded: a few MB of PNG can unpack
# into gigabytes. Pillow's own limit (`Image.MAX_IMAGE_PIXELS`), about 9,460 x 9,460.
MAX_IMAGE_PIXELS = 89_478_485
PNG = b"\x89PNG\r\n\x1a\n"  # a PNG file's first bytes
# The largest `data.image_size` (and image size a checkpoint may name): a batch of 64 RGB images
# of 4096 px is 3 GB as uint8 and 13 GB as float32; larger sizes exhaust memory before anything
# else is checked.
MAX_IMAGE_SIZE = 4096
ImageSize = Annotated[int, Interval(ge=1, le=MAX_IMAGE_SIZE)]
# A random crop's share of the image: [low, high], within (0, 1].
CropScale = tuple[Annotated[float, Interval(gt=0, le=1)], Annotated[float, Interval(gt=0, le=1)]]


class BadImageError(ValueError):
    """The bytes are no image that Pillow and TorchCodec can decode."""


def image_size(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> tuple[int, int]:
    """(width, height) from the file's header, nothing decoded. BadImageError for bytes that are
    no image Pillow knows, or an image of more than `max_pixels` pixels."""
    if not data:
        raise BadImageError("an empty file (0 bytes)")
    if data[:8] == PNG and data[12:16] == b"IHDR" and len(data) >= 24:  # IHDR comes first
        width, height = struct.unpack(">II", data[16:24])  # (~1 µs, Pillow's ~12: small PNGs)
    else:
        width, height = _pillow_size(data, max_pixels)
    if width * height > max_pixels:
        raise BadImageError(
            f"{width}x{height} pixels, more than the {max_pixels:,} that max_image_pixels "
            f"allows: not decoded"
        )
    return width, height


def _pillow_size(data: bytes, max_pixels: int) -> tuple[int, int]:
    from PIL import Image

    if Image.MAX_IMAGE_PIXELS is not None and max_pixels > Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = max_pixels  # (Pillow refuses twice its own limit on opening)
    try:
        with warnings.catch_warnings():  # what it warns of is checked against our own limit
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                return image.size
    except Image.DecompressionBombError as err:
        raise BadImageError(str(err).split(",")[0]) from None
    except Exception:  # Pillow raises many types for bytes it cannot read
        raise BadImageError("not an image Pillow can read") from None


def decode(data: bytes, channels: int, max_pixels: int = MAX_IMAGE_PIXELS) -> torch.Tensor:
    """uint8 `channels`×H×W (1: grayscale, 3: RGB; alpha dropped). BadImageError for bytes that
    are no image, or an image of more than `max_pixels` pixels (`image_size`)."""
    from torchcodec.decoders import ImageReadMode, decode_image

    image_size(data, max_pixels)
    if data[:3] == b"\xff\xd8\xff" or data[:8] == PNG:  # JPEG, PNG: TorchCodec's is faster
        mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
        try:
            return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=mode)
        except (RuntimeError, ValueError):  # broken after the header
            raise BadImageError("TorchCodec cannot decode it: damaged or cut short") from None
    import numpy as np
    from PIL import Image

    try:  # the first frame of a GIF (TorchCodec would decode all of them)
        with Image.open(io.BytesIO(data)) as image:
            pixels = torch.from_numpy(np.array(image.convert("L" if channels == 1 else "RGB")))
    except Exception as err:  # Pillow raises many types for broken files
        raise BadImageError(str(err) or type(err).__name__) from None
    return pixels.unsqueeze(0) if channels == 1 else pixels.permute(2, 0, 1).contiguous()


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
