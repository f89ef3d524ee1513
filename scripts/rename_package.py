"""Rename the package (src/<old> → src/<new>, src/hydra_plugins/<old> → .../<new>) and every
mention of it, for a project made from this template:

    python scripts/rename_package.py mynet
    pip install -e ".[dev]"   # re-install under the new name

It renames in the files git tracks (plus new, not ignored ones), so run it in a git checkout.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def current_name() -> str:
    packages = [p.name for p in (ROOT / "src").iterdir() if (p / "__init__.py").is_file()]
    if len(packages) != 1:
        sys.exit(f"error: expected one package in {ROOT / 'src'}, found {packages or 'none'}.")
    return packages[0]


def project_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) != 1 or not re.fullmatch(r"[a-z_][a-z0-9_]*", argv[0]):
        print(__doc__)
        print("error: give one new name: lowercase letters, digits and underscores.")
        return 1
    new, old = argv[0], current_name()
    if new == old:
        print(f"the package is already called {old}")
        return 0
    if (ROOT / "src" / new).exists():
        print(f"error: {ROOT / 'src' / new} already exists.")
        return 1

    pattern = re.compile(rf"\b{re.escape(old)}\b")
    changed = 0
    for path in project_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary files do not mention the package
        renamed = pattern.sub(new, text)
        if renamed != text:
            path.write_text(renamed)
            changed += 1
    # src/<old> and the Hydra plugins in src/hydra_plugins/<old>
    for directory in sorted((ROOT / "src").rglob(old), reverse=True):
        if directory.is_dir():
            directory.rename(directory.with_name(new))
    for egg_info in (ROOT / "src").glob(f"{old}.egg-info"):
        print(f"note: remove the stale {egg_info.name} (rm -r {egg_info})")
    print(f"Renamed {old} -> {new} in {changed} files and moved src/{old} to src/{new}.")
    print('Next: pip install -e ".[dev]" && make test')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
