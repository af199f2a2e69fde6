"""One process per run directory: ``RUN_DIR/.lock``, held by training and import.

The lock is ``flock``, an OS-level lock the kernel releases when the process ends, however it
ends (``kill -9`` included), so a stale lock file never blocks anyone. The file is vaswani's
own: created exclusively, never followed through a link, written in place (never
truncated), and a ``.lock`` of anyone else's (a file, a link, a second name of a file
elsewhere) is a refusal that leaves it as it is and does not show its bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import sys
from pathlib import Path

LOCK = ".lock"
LOCK_HEADER = "vaswani run lock: "  # how vaswani's lock file begins (a user's never does)


class RunInUse(FileExistsError):
    """Another process holds the run directory's lock."""


class NotOurLock(FileExistsError):
    """``RUN_DIR/.lock`` is not vaswani's: nothing was touched."""


def _lock_record(pid: int | None) -> bytes:
    """The lock file's one line, always one length: written in place over the last one."""
    return f"{LOCK_HEADER}{'pid ' + str(pid) if pid else 'free':<16}\n".encode()


def _open_lock(path: Path) -> int:
    """``path`` opened for the lock: created exclusively, or, where it exists, opened without
    following a link and only if it is vaswani's (a regular file of one name, empty or
    holding a lock record; older versions wrote a bare pid). Anything else is a
    :class:`NotOurLock` naming it, and its bytes are neither changed nor shown."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError as e:  # a link (ELOOP), a folder, a file this user cannot write
        kind = "a symbolic link" if path.is_symlink() else f"not usable ({e.strerror})"
        raise NotOurLock(f"{path} is {kind}, not vaswani's lock file; move it, or choose "
                         "another --out") from None
    info = os.fstat(fd)
    head = os.pread(fd, len(LOCK_HEADER) + 32, 0)
    ours = not head or head.strip().isdigit() or head.startswith(LOCK_HEADER.encode())
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or not ours:
        os.close(fd)
        why = ("a file with other names too (a hard link)" if info.st_nlink != 1 else
               "a file of someone else's")
        raise NotOurLock(f"{path} is {why}, not vaswani's lock file, and was left as it is; "
                         "move it, or choose another --out")
    return fd


@contextlib.contextmanager
def locked(run_dir: Path):
    """Hold ``run_dir/.lock`` while the block runs (creating ``run_dir`` if needed). The pid
    written in it only lets the next process say whose lock it took over."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(run_dir / LOCK)
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace")
        previous = "".join(c for c in text.removeprefix(LOCK_HEADER) if c.isdigit())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunInUse(f"{run_dir} is in use by another vaswani process (pid "
                           f"{previous or '?'}); wait for it to finish, or stop it") from None
        if previous and previous != str(os.getpid()):
            print(f"vaswani: {run_dir} was left locked by process {previous}, which is no "
                  "longer running; taking over", file=sys.stderr, flush=True)
        os.pwrite(fd, _lock_record(os.getpid()), 0)
        try:
            yield
        finally:
            os.pwrite(fd, _lock_record(None), 0)  # a clean exit leaves no pid behind
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
