"""Child processes of a test that never outlive it.

torchrun starts each rank in a session of its own (so that it can signal a rank's whole
group), so killing torchrun's process group on a timeout leaves the ranks running, and a
killed torchrun leaves them orphaned. :func:`run` is ``subprocess.run`` that, on a timeout,
kills every descendant of the command (found through ``/proc``, whatever session it is in)
before raising; :func:`kill_tree` does the same for a ``Popen`` a test manages itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from benchmarks.ports import free_port as free_port  # servers' and ranks' ports


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (children first, then theirs), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        ppid = int(text[text.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie, ended but not reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` seconds for ``pids`` to end; those still running."""
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process below it, then reap ``proc`` (nothing, if it was
    reaped already: its pid may be another process's by now)."""
    if proc.poll() is not None:
        return
    # the tree is listed before anything is killed (a killed parent's children are re-parented
    # and no longer found below it), and the parent killed first (torchrun with restarts left
    # would start new ranks for the killed ones)
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def run(cmd: list[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)``,
    except that a timeout kills the command's whole tree (torchrun's ranks included) before
    ``TimeoutExpired`` is raised with what the command had printed."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
