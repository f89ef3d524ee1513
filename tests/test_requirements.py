"""pyproject.toml's ranges keep out releases known to be bad: every requirement, runtime and
extras alike, must exclude each release listed here."""

from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11 and later")

# package: (releases that must not install, why)
KNOWN_BAD = {
    "lightning": (
        ["2.6.0", "2.6.2", "2.6.3", "2.6.5"],
        "2.6.2 and 2.6.3 compromised (GHSA-w37p-236h-pfx3); below 2.6.6 load_from_checkpoint "
        "imports what a checkpoint names (CVE-2026-58659)",
    ),
    "torch": (["2.5.1"], "torch.load(weights_only=True) runs code below 2.6 (CVE-2025-32434)"),
    "pillow": (["10.4.0", "11.2.1"], "heap overflow below 11.3 (CVE-2025-48379)"),
    "onnx": (["1.16.1"], "arbitrary file overwrite below 1.17 (CVE-2024-5187)"),
    "starlette": (["0.47.0", "1.0.0", "1.2.0"], "CVE-2026-48710, CVE-2026-54282 below 1.3"),
    "python-multipart": (["0.0.18", "0.0.29"], "denial of service below 0.0.30 (CVE-2026-53539)"),
    "setuptools": (["70.0.0", "78.1.0"], "path traversal below 78.1.1 (CVE-2025-47273)"),
}


def requirements() -> list[Requirement]:
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    listed = project["project"]["dependencies"] + project["build-system"]["requires"]
    for extra in project["project"]["optional-dependencies"].values():
        listed += extra
    return [Requirement(text) for text in listed]


@pytest.mark.parametrize("package", KNOWN_BAD)
def test_no_requirement_admits_a_known_bad_release(package):
    bad, why = KNOWN_BAD[package]
    found = [r for r in requirements() if r.name.lower() == package]
    if package in ("lightning", "torch", "pillow", "setuptools"):
        assert found, f"{package} is required directly: its floor must be declared"
    for requirement in found:
        admitted = [v for v in bad if requirement.specifier.contains(v, prereleases=True)]
        assert not admitted, f"{requirement} admits {admitted}: {why}"
