"""An offline call split across processes, each with its own copy of the run:
``vaswani.load(RUN, workers=N)``, as CTranslate2's ``inter_threads`` runs batches side by side.

Why: a decode step of a small model on a CPU is partly the model's products, which keep every
core busy, and partly the engine's own Python (a beam search's ranking and bookkeeping, the
next step's plan), which keeps one busy and leaves the others idle. Two copies of the run
with one thread each fill that gap: each one's Python runs while the other multiplies (what
it buys, against CTranslate2 too: docs/performance.md, "Translating with a worker per
core").

A process each, not a thread: a compiled step's call and the engine's Python both hold
Python's GIL, so two threads would take turns. Each is a new Python process (not a fork: a
forked child of a process whose OpenMP threads have run can hang in its first parallel
region, and not multiprocessing's spawn, which imports the caller's own script again), on
one end of a socket pair; it loads the run as this process loaded it, with ``threads // N``
threads of its own; this process is the first worker, under as many threads for the call.
A worker starts in about as long as ``vaswani.load`` takes, once, when the run is loaded.
Its process is vaswani's own: it starts as cli/worker.py, under the malloc settings a
``vaswani`` command makes for its process, and says whether they took
(``Workers.malloc_pinned``).

The texts are dealt out longest first, one to each worker in turn, so every share has as many
long texts as short ones and the workers finish together; each share decodes as the whole
call would (its own batches, longest first), and the results come back in the texts' order.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import weakref
from multiprocessing.connection import Connection
from typing import Any

import torch


class WorkerError(RuntimeError):
    """A worker process ended, or could not load its copy of the run."""


def deal(lengths: list[int], count: int) -> list[list[int]]:
    """Indices of ``lengths`` dealt into ``count`` shares: longest first, one to each share
    in turn (equal lengths in their order)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[k::count] for k in range(count)]


@contextlib.contextmanager
def threads(n: int):
    """torch's intra-op threads set to ``n`` for the block, then set back."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Workers:
    """``count - 1`` processes that each hold a copy of the run ``vaswani.load(**load)``
    gives, with ``threads // count`` threads each (this process being the first worker)."""

    def __init__(self, count: int, load: dict[str, Any], threads: int) -> None:
        self.count, self.threads = count, max(1, threads // count)
        self._pipes, self._processes = [], []
        self.malloc_pinned: list[bool] = []  # each worker process's, as it said
        for _ in range(1, count):  # each on one end of a socket pair, this process the other
            ours, theirs = socket.socketpair()
            self._processes.append(subprocess.Popen(  # (its stdout is not the caller's)
                [sys.executable, "-m", "vaswani.cli.worker", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdout=subprocess.DEVNULL))
            theirs.close()
            self._pipes.append(Connection(ours.detach()))
        self._closed = weakref.finalize(self, close, self._pipes, self._processes)
        for pipe in self._pipes:
            pipe.send((load, self.threads))
        for i in range(len(self._pipes)):  # each worker's copy loaded, or why not
            kind, value = self._receive(i)
            if kind == "error":
                self.close()
                raise WorkerError(f"worker {i + 1} could not load {load['run_dir']}: "
                                  f"{value}") from value
            self.malloc_pinned.append(value["malloc_pinned"])

    def close(self) -> None:
        """End the worker processes (also done when this object is collected, or at exit)."""
        self._closed()

    def map(self, run, method: str, texts: list[str], lengths: list[int], *args, **kwargs
            ) -> list:
        """``getattr(run, method)(texts, *args, **kwargs)``, a list with one result per text,
        computed as shares of ``texts`` (dealt by their ``lengths``: :func:`deal`), one in
        each worker, this process's by ``run`` itself; the results in the texts' order. An
        error a worker raised is raised here."""
        if not self._closed.alive:
            raise WorkerError("the workers were closed")
        shares = deal(lengths, self.count)  # (this process's share the first, never empty)
        busy = [i for i in range(len(self._pipes)) if shares[i + 1]]  # fewer texts: fewer
        for i in busy:
            self._pipes[i].send((method, [texts[k] for k in shares[i + 1]], args, kwargs))
        try:
            with threads(self.threads):
                parts = [getattr(run, method)([texts[k] for k in shares[0]], *args, **kwargs)]
        finally:  # every worker's answer read, whatever happened here: the pipes stay in step
            answers = [self._receive(i) for i in busy]
        for kind, value in answers:
            if kind == "error":
                raise value
            parts.append(value)
        results: list = [None] * len(texts)
        for share, part in zip([shares[0]] + [shares[i + 1] for i in busy], parts, strict=True):
            for k, result in zip(share, part, strict=True):
                results[k] = result
        return results

    def _receive(self, i: int) -> tuple[str, Any]:
        """Worker i's next answer: ("ok", value) or ("error", an exception to raise)."""
        try:
            return self._pipes[i].recv()
        except (EOFError, OSError):
            process = self._processes[i]
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
            return "error", WorkerError(f"worker {i + 1} ended (exit code "
                                        f"{process.returncode}) before it answered")


def close(pipes: list, processes: list) -> None:
    """Tell each worker to stop, then wait for it (a moment), else end it."""
    for pipe in pipes:
        with contextlib.suppress(OSError, ValueError):
            pipe.send(None)
            pipe.close()
    for process in processes:
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def serve(pipe, malloc_pinned: bool = False) -> None:
    """A worker process: load the run as told, say so (and whether its process runs with
    malloc's thresholds pinned), then answer each (method, texts, args, kwargs) with ("ok",
    the method's result) or ("error", what it raised), until told to stop (or its caller is
    gone)."""
    try:
        load, threads = pipe.recv()
    except EOFError:  # its caller ended before it said what to load
        return
    torch.set_num_threads(threads)
    from . import load as load_run

    try:
        run = load_run(**load)
    except Exception as e:  # noqa: BLE001 (any failure goes back to the caller)
        answer(pipe, "error", e)
        return
    answer(pipe, "ok", {"malloc_pinned": malloc_pinned})
    with contextlib.suppress(EOFError):
        while (message := pipe.recv()) is not None:
            method, texts, args, kwargs = message
            try:
                answer(pipe, "ok", getattr(run, method)(texts, *args, **kwargs))
            except Exception as e:  # noqa: BLE001
                answer(pipe, "error", e)


def answer(pipe, kind: str, value: Any) -> None:
    """Send (kind, value); a value that cannot be pickled (a result, or an exception) goes as
    an error, a RuntimeError that names it."""
    try:
        pipe.send((kind, value))
    except Exception as e:  # noqa: BLE001 (pickling)
        pipe.send(("error", RuntimeError(f"a worker's {kind} answer could not be sent "
                                         f"({e}): {type(value).__name__}: {value}")))


def main(fd: int, malloc_pinned: bool = False) -> None:
    """A worker process's start (cli/worker.py): its end of the socket pair is file
    descriptor ``fd``."""
    serve(Connection(fd), malloc_pinned)
