"""A folder of shards as one checkpoint file, for eval.py and every command that takes one:

python -m litforge.model_parallel to-file FOLDER [FILE]  # FILE: default FOLDER's name, .pt
"""

from __future__ import annotations

import argparse
import sys

from litforge.checkpoints import override
from litforge.errors import UserError
from litforge.model_parallel.shards import to_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m litforge.model_parallel",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser(
        "to-file",
        help="put a folder of shards (strategy.save_distributed_checkpoint=true) together into "
        "one checkpoint file, on this machine's CPU",
    )
    convert.add_argument(
        "folder", help="a checkpoint folder of shards, e.g. <run>/checkpoints/last.ckpt"
    )
    convert.add_argument(
        "file",
        nargs="?",
        help="the file to write (default: beside the folder, its name ending in .pt: last.pt)",
    )
    args = parser.parse_args(argv)
    try:
        written = to_file(args.folder, args.file)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(
        f"Wrote {written}: its weights and settings, for eval.py and every command that takes "
        f"a checkpoint file ({override('ckpt_path', written)}). Resuming goes on from the folder."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
