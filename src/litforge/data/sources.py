"""Where dataset files come from: one lookup for every dataset. A folder given for the dataset
(`data.data_dir`) is used or the run stops: the files are in it (or its `<name>/`), else
downloaded into it. Without one, the first that works of: `<root_dir>/<name>/` (default
`<project>/data/<name>/`); `<system_dir>/<system_name>/`, where Debian's dataset packages install
(`apt-get install dataset-fashion-mnist`); a download into `<root_dir>/<name>/` from the mirrors,
checked against MD5 sums. Else `DatasetNotFoundError` lists every place tried and how to fix it."""

import logging
import socket
from dataclasses import dataclass
from pathlib import Path

from litforge.errors import UserError

log = logging.getLogger(__name__)


class DatasetNotFoundError(UserError):
    """No source had the dataset's files."""


@dataclass(frozen=True)
class DatasetSource:
    """`files` make the dataset complete (named without `.gz`; a gzipped copy counts too);
    `resources`: (archive name, md5) pairs to download from each mirror."""

    name: str
    files: tuple[str, ...]
    mirrors: tuple[str, ...] = ()
    resources: tuple[tuple[str, str], ...] = ()
    system_name: str | None = None
    debian_package: str | None = None
    extract: bool = False  # archives that unpack into `files` (CIFAR-10's tarball)
    aliases: tuple[str, ...] = ()  # other dirs in data_dir, e.g. torchvision's


def find_file(directory: Path, filename: str) -> Path | None:
    candidates = (directory / filename, directory / f"{filename}.gz")
    return next((candidate for candidate in candidates if candidate.is_file()), None)


def is_complete(directory: Path, source: DatasetSource) -> bool:
    return all(find_file(directory, f) is not None for f in source.files)


def download(source: DatasetSource, target: Path) -> list[str]:
    """Try each mirror for each resource into `target`; returns the failures (empty on success).
    torchvision's helpers follow redirects and check MD5 sums."""
    from torchvision.datasets.utils import download_url, extract_archive

    created = [d for d in (target, *target.parents) if not d.exists()]  # to undo on failure
    target.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    previous_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(30)  # seconds: an unreachable mirror must not hang a run
    try:
        for filename, md5 in source.resources:
            for mirror in source.mirrors:
                url = f"{mirror}{filename}"
                try:
                    download_url(url, str(target), filename=filename, md5=md5)
                    if source.extract:
                        extract_archive(str(target / filename), str(target), remove_finished=True)
                    break
                except Exception as err:  # network errors come in many types; all mean "next"
                    failures.append(f"{url}: {err}")
                    (target / filename).unlink(missing_ok=True)  # no half-written archive
            else:
                break
    finally:
        socket.setdefaulttimeout(previous_timeout)
    if is_complete(target, source):
        return []
    for directory in created:  # innermost first: leave nothing behind from a failed attempt
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
    return failures or [f"{target}: incomplete after download"]


def locate(
    source: DatasetSource,
    data_dir: str | Path,
    system_dir: str | Path | None = "/usr/share/datasets",
    allow_download: bool = True,
    given: bool = False,
) -> Path:
    """Return the first directory holding all of the dataset's files, downloading if needed.
    `given`: `data_dir` is the dataset's own folder (used, or an error), not a root to search."""
    data_dir = Path(data_dir).expanduser()
    tried = [data_dir] if given else []
    tried += [data_dir / source.name, *(data_dir / alias for alias in source.aliases)]
    if system_dir and not given:
        tried.append(Path(system_dir).expanduser() / (source.system_name or source.name))
    tried = list(dict.fromkeys(tried))  # an alias "" is data_dir itself
    for directory in tried:
        if is_complete(directory, source):
            return directory

    failures = ["download disabled (data.download=false)"]
    if allow_download and source.mirrors:
        target = data_dir if given else data_dir / source.name
        log.info("Downloading %s into %s", source.name, target)
        failures = download(source, target)
        if not failures:
            return target

    where = f" in the given folder {data_dir}" if given else ""
    lines = [f"dataset '{source.name}' not found{where}. Looked for {', '.join(source.files)} in:"]
    lines += [f"  - {d}" for d in tried]
    lines.append(f"  - download: {failures[-1] if failures else 'no mirrors'}")
    if given:
        fix = f"{data_dir}, or leave data.data_dir unset (null) to look in the usual places"
    else:
        fix = f"{data_dir / source.name} (or give their folder as data.data_dir=<folder>)"
    lines.append(f"Fix: put the files into {fix}")
    if source.debian_package:
        lines.append(f"  or install Debian's copy: sudo apt-get install -y {source.debian_package}")
    lines.append(
        f"  or fetch it on a machine with internet: python -m litforge.data fetch {source.name}"
    )
    raise DatasetNotFoundError("\n".join(lines))
