"""What `optimize`'s worker processes run for each image file. A module of its own, free of
Lightning imports: spawned workers (macOS) start by importing it."""

from __future__ import annotations

import os
from pathlib import Path

from litforge.data.images import MAX_IMAGE_PIXELS, BadImageError, decode, fit


def check_decodes(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> None:
    """BadImageError unless `data` decodes as training will decode it."""
    decode(data, 3, max_pixels)


def shard_sample(
    item: tuple[str, int],
    bad_dir: str,
    pixels: tuple[int, int] | None = None,
    max_pixels: int = MAX_IMAGE_PIXELS,
) -> dict | None:
    """A shard sample: the file's bytes as they are, or with `pixels=(channels, size)` its decoded
    uint8 pixels fitted to size×size; and its label. A file that does not decode is left out
    (None), its name written into `bad_dir` for the parent process to report."""
    path, label = item
    try:
        data = Path(path).read_bytes()
        if pixels is None:
            check_decodes(data, max_pixels)
        else:
            channels, size = pixels
            data = fit(decode(data, channels, max_pixels), size).contiguous().numpy().tobytes()
    except (BadImageError, OSError) as err:
        with open(Path(bad_dir) / f"{os.getpid()}.txt", "a") as out:
            out.write(f"{path}\t{err}\n")
        return None
    return {"image": data, "label": label}
