"""The host libraries' own model tests, fetched from their source distributions for the installed versions (the
files are not copied into this repository): ``pip download --no-binary :all: --no-deps NAME==VERSION``, then the
members a harness needs are extracted into ``.host-suites/NAME-VERSION/`` (ignored by git, reused between runs)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".host-suites"


def fetch_suite(package: str, members: list[str]) -> Path:
    """The folder holding ``members`` (paths inside the sdist, e.g. ``tests/test_models.py``) of the installed
    ``package``'s sdist. Raises RuntimeError if the sdist cannot be downloaded."""
    version = importlib.metadata.version(package)
    folder = CACHE / f"{package}-{version}"
    if all((folder / m).exists() for m in members):
        return folder
    download = CACHE / "sdists"
    download.mkdir(parents=True, exist_ok=True)
    archive = next(download.glob(f"{package}-{version}.tar.gz"), None)
    if archive is None:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                               "-q", "-d", str(download), f"{package}=={version}"],
                              capture_output=True, text=True, timeout=600)
        archive = next(download.glob(f"{package}-{version}.tar.gz"), None)
        if archive is None:
            raise RuntimeError(f"could not download the {package} {version} sdist: {done.stderr[-500:]}")
    with tarfile.open(archive) as tar:
        for member in members:
            source = tar.extractfile(f"{package}-{version}/{member}")
            if source is None:
                raise RuntimeError(f"{archive.name} has no {member}")
            target = folder / member
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read())
    return folder
