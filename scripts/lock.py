"""The hash-pinned install profiles, `requirements/<profile>.txt`, made from pyproject.toml.

    python scripts/lock.py            # refresh after editing dependencies (keeps the other pins)
    python scripts/lock.py --upgrade  # move every pin to the newest release pyproject allows
    python scripts/lock.py --check    # exit 1 when a file is stale against pyproject.toml
    python scripts/lock.py --prune    # offline: drop the pins no remaining requirement needs

Profiles: `runtime` (the dependencies) and `dev` (and every extra the dev extra names). uv
resolves them for each platform and Python version the project supports (`--universal`) from
the index it is configured for (UV_INDEX_URL, UV_EXTRA_INDEX_URL); the files name no index, so
pip installs them from whichever index it is configured for (scripts/install.sh). Each file's
first line holds a digest of pyproject's dependency tables: `--check` compares it, offline.
Standard library only (Python >= 3.11; on 3.10 it needs `pip install tomli`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROFILES = {"runtime": [], "dev": ["--extra", "dev"]}
DIGEST = re.compile(r"^# pyproject digest: ([0-9a-f]+)$", re.M)
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", re.M)
# uv's notes on who needs a pin: `# via NAME`, or `# via` then `#   NAME` lines
VIA = re.compile(r"^\s+#\s+(?:via\s+)?(?!via\s*$)([A-Za-z0-9][\w.-]*)\s*$", re.M)
REFRESH = "python scripts/lock.py"


def inputs_digest(pyproject: Path) -> str:
    """Of what the lock is made from: requires-python, the dependencies and the extras."""
    project = tomllib.loads(pyproject.read_text())["project"]
    keys = ("requires-python", "dependencies", "optional-dependencies")
    inputs = json.dumps({key: project.get(key) for key in keys}, sort_keys=True)
    inputs = inputs.replace(project["name"], "<project>")  # a renamed fork's lock stays current
    return hashlib.sha256(inputs.encode()).hexdigest()[:16]


def lock_path(root: Path, profile: str) -> Path:
    return root / "requirements" / f"{profile}.txt"


def stale(root: Path) -> list[str]:
    """What is wrong with the profiles' files, one line each (none: they are current)."""
    digest, problems = inputs_digest(root / "pyproject.toml"), []
    for profile in PROFILES:
        path = lock_path(root, profile)
        if not path.is_file():
            problems.append(f"{path.relative_to(root)} is missing")
            continue
        text = path.read_text()
        found = DIGEST.search(text)
        if not found or found.group(1) != digest:
            problems.append(f"{path.relative_to(root)} was made from another pyproject.toml")
        if re.search(r"^\s*(-i|--index-url|--extra-index-url|-f|--find-links)\b", text, re.M):
            problems.append(f"{path.relative_to(root)} names an index: it must not")
    return problems


def compile_profiles(root: Path, extra_args: list[str]) -> None:
    uv = shutil.which("uv") or sys.exit("error: uv is not installed: pip install uv")
    digest = inputs_digest(root / "pyproject.toml")
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    # every Python the project supports: from the version requires-python names (">=3.10")
    oldest_python = re.search(r"\d+\.\d+", project["requires-python"]).group()
    for profile, args in PROFILES.items():
        path = lock_path(root, profile)
        path.parent.mkdir(exist_ok=True)
        command = [uv, "pip", "compile", "pyproject.toml", *args, "--universal"]
        command += ["--python-version", oldest_python, "--generate-hashes", "--quiet"]
        command += ["--no-emit-index-url", "--no-emit-find-links"]
        command += ["--custom-compile-command", REFRESH, "-o", str(path), *extra_args]
        if subprocess.run(command, cwd=root).returncode:
            sys.exit(f"error: uv could not resolve the {profile} profile (above).")
        text = DIGEST.sub("", path.read_text()).lstrip("\n")
        text = re.sub(r"^ +#   -c .*\n", "", text, flags=re.M)  # this machine's constraint files
        path.write_text(f"# pyproject digest: {digest}\n{text}")
        print(f"wrote {path.relative_to(root)}")


def requirement_name(requirement: str) -> str:
    return normalize(re.match(r"[A-Za-z0-9._-]+", requirement).group())


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def profile_requirements(project: dict, profile: str) -> list[str]:
    """The requirements a profile installs: the dependencies and its extras' (recursively)."""
    extras, own = project.get("optional-dependencies", {}), normalize(project["name"])
    wanted, pending = list(project.get("dependencies", [])), PROFILES[profile][1:]
    while pending:  # an extra may name the project's other extras: `litforge[a,b]`
        for requirement in extras.get(pending.pop(), []):
            if requirement_name(requirement) == own:
                pending += re.search(r"\[(.*)\]", requirement).group(1).split(",")
            else:
                wanted.append(requirement)
    return wanted


def prune(root: Path) -> None:
    """Keep the pins that the profile's requirements reach through uv's `# via` notes."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    for profile in PROFILES:
        wanted = profile_requirements(project, profile)
        path = lock_path(root, profile)
        header, *entries = re.split(r"\n(?=[A-Za-z0-9])", path.read_text())
        pins = [(normalize(PIN.match(e).group(1)), e) for e in entries]  # a name per marker
        needs: dict[str, set[str]] = {}  # package -> the pinned packages it brings
        for name, entry in pins:
            for parent in VIA.findall(entry):
                needs.setdefault(normalize(parent), set()).add(name)
        roots = {requirement_name(r) for r in wanted}
        if missing := sorted(roots - {name for name, _ in pins}):
            sys.exit(f"error: {path} lacks {', '.join(missing)}: refresh it with `{REFRESH}`.")
        kept, todo = set(), list(roots)
        while todo:
            if (name := todo.pop()) not in kept:
                kept.add(name)
                todo += needs.get(name, ())
        entries = [entry for name, entry in pins if name in kept]
        text = "\n".join([header, *entries])
        digest = inputs_digest(root / "pyproject.toml")
        path.write_text(DIGEST.sub(f"# pyproject digest: {digest}", text, count=1))
        print(f"{path.relative_to(root)}: kept {len(entries)} of {len(pins)} pins")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="exit 1 when a file is stale")
    action.add_argument("--prune", action="store_true", help="drop pins nothing needs (offline)")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args, uv_args = parser.parse_known_args()
    if args.check:
        if problems := stale(args.root):
            sys.exit(
                "error: the lock is stale: " + "; ".join(problems) + f". Refresh: `{REFRESH}`."
            )
        print("requirements/*.txt are current with pyproject.toml")
    elif args.prune:
        prune(args.root)
    else:
        compile_profiles(args.root, uv_args)


if __name__ == "__main__":
    main()
