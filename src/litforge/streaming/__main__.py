"""An image folder to streaming shards, once, before training with `data=streaming`:

python -m litforge.streaming optimize SRC_DIR OUT_DIR  # SRC_DIR/<split>/<class>/<image>
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from litforge.data.images import MAX_IMAGE_PIXELS
from litforge.errors import UserError
from litforge.streaming.datamodule import optimize_folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m litforge.streaming",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    optimize_parser = commands.add_parser(
        "optimize", help="convert an image folder into streaming shards (needs litdata)"
    )
    optimize_parser.add_argument("source", help="an image folder: SOURCE/<split>/<class>/<image>")
    optimize_parser.add_argument("output", help="a local folder or an object-store URL (s3://...)")
    optimize_parser.add_argument("--val-fraction", type=float, default=0.1)
    optimize_parser.add_argument("--test-fraction", type=float, default=0.1)
    optimize_parser.add_argument("--split-seed", type=int, default=0)
    optimize_parser.add_argument("--on-bad-file", choices=("error", "skip"), default="error")
    optimize_parser.add_argument("--chunk-bytes", default="64MB", help="size of a shard file")
    optimize_parser.add_argument(
        "--workers", type=int, default=os.cpu_count(), help="processes (default: one per CPU)"
    )
    optimize_parser.add_argument(
        "--store",
        choices=("files", "pixels"),
        default="files",
        help="files: the image files' bytes (compact); pixels: decoded, at --image-size "
        "(no decoding when training, more disk)",
    )
    optimize_parser.add_argument(
        "--image-size", type=int, help="what training resizes to (default 224; pixels: stored so)"
    )
    optimize_parser.add_argument(
        "--channels", type=int, choices=(1, 3), help="what images are converted to (default 3)"
    )
    optimize_parser.add_argument(
        "--max-image-pixels",
        type=int,
        default=MAX_IMAGE_PIXELS,
        help="larger images are bad files, never decoded (default: %(default)s, Pillow's limit)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    try:
        optimize_folder(
            args.source,
            args.output,
            val_fraction=args.val_fraction,
            test_fraction=args.test_fraction,
            split_seed=args.split_seed,
            on_bad_file=args.on_bad_file,
            chunk_bytes=args.chunk_bytes,
            num_workers=args.workers,
            store=args.store,
            image_size=args.image_size,
            channels=args.channels,
            max_image_pixels=args.max_image_pixels,
        )
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
