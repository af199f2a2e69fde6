"""Crash-safe writes: the one module through which vaswani writes a file or a folder that
something later trusts (run directories, weights, tokenizers, datasets, encoded data,
downloads, exports).

The rule everywhere: nothing incomplete ever sits under its final name.

* a file is written to ``NAME.tmp``, fsync'ed and renamed over ``NAME`` (:func:`atomic_write`);
  a kill at any moment leaves the previous version readable, and a failed write (a full disk)
  is a :class:`WriteError` that says so, with the previous version intact;
* a folder is built in a private temporary folder beside its final place and renamed into
  place when complete (:func:`building`); private folders left behind by processes that died
  (a kill -9) are removed by the next one;
* two processes that build the same thing at once (two trainings started together on one
  dataset) take turns (:func:`one_at_a_time`): the second finds the first's work done;
* a log line is appended and fsync'ed at once (:func:`append_line`);
* :func:`file_sha256` is the one checksum of a file's bytes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


class WriteError(OSError):
    """A file could not be written; the previous version of it is intact."""


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp_path)``, fsync the result and rename it to ``path``. If anything
    fails, the temporary file is removed, ``path`` is untouched, and the error says why."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    except Exception as e:  # OSError, and torch's and safetensors' own error types
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(path, e) from e
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_error(path: Path, cause: BaseException,
                kept: str = "the previous version of the file, if any, is intact"
                ) -> WriteError:
    """A one-line :class:`WriteError` for ``path``, saying when the disk is full and what
    is ``kept``."""
    reason = str(cause).strip().splitlines()[0][:160] if str(cause).strip() else type(cause)
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    full = getattr(cause, "errno", None) == errno.ENOSPC or "space" in str(cause).lower() or (
        free is not None and free < 1 << 20)
    hint = (f"; the disk is full ({(free or 0) >> 20} MiB free)" if full else "")
    return WriteError(f"could not write {path} ({reason}){hint}; {kept}")


WRITE_REFUSED = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS}


def failed_write(error: BaseException) -> bool:
    """Whether ``error`` is the machine refusing a write (a full disk or quota, a read-only
    or failing device) rather than a fault of the program or of its input: an ``OSError``
    with such an errno, or a library's own error type that says so (safetensors raises
    ``SafetensorError: ... I/O error: No space left on device``)."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno in WRITE_REFUSED
    text = str(error)
    return "I/O error" in text or "No space left" in text


def private_dir(parent: Path, prefix: str) -> Path:
    """A new temporary folder ``parent/.PREFIX.PID.XXXX`` for building something that is
    renamed into place when complete. Such folders left in ``parent`` by processes that died
    are removed first."""
    parent.mkdir(parents=True, exist_ok=True)
    for old in parent.glob(".*.*.*"):
        pid = old.name.rsplit(".", 2)[1]
        if old.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f".{prefix}.{os.getpid()}.", dir=parent))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def building(final: Path) -> Iterator[Path]:
    """Build a folder: yields a private folder beside ``final``; when the block ends without
    an error it replaces ``final`` (renamed into place), otherwise it is removed and
    ``final`` is left as it was."""
    tmp = private_dir(final.parent, final.name)
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def one_at_a_time(final: Path) -> Iterator[None]:
    """Hold ``final``'s lock file (``.NAME.lock`` beside it; ``flock``, waiting for it) while
    the block runs. Two processes building the same folder at once would each replace the
    other's, and a reader of the first's could find it gone mid-way: the caller looks again
    for a finished ``final`` inside the block, and builds only if none is there. The kernel
    releases the lock when its holder exits, killed or not."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"vaswani: another process is making {final}; waiting for it",
                  file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def append_line(path: Path, line: str) -> None:
    """Add one line to a log file, flushed to disk: a kill cuts at most this line short (and
    its reader drops a line cut short)."""
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
