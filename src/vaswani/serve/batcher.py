"""An encoder's work, with requests that arrive together batched (a translator's or a language
model's runs on its inference engine instead): the server's loop (loop.py) steps a
:class:`Batcher` as it steps an engine, in the one thread that runs every model.

Jobs wait in a bounded queue (a full queue is the loop's ``Busy``, a 503 for the caller); a
batch is the jobs of one kind at the queue's front, up to ``max_batch`` of them, run once it is
full, once a job of another kind follows it, or ``max_wait_ms`` after its first job arrived
(the loop sleeps until then when it has nothing else to do). A batch computes for each job
what the job would get alone (classification and embeddings are padding-invariant); a batch
that fails is run again job by job, so only a job that fails alone gets the error. A job whose
client went away (``cancelled``) is dropped before it runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


class Busy(Exception):
    """Too many requests are waiting; the client should try again later."""


@dataclass
class Job:
    """One request's work: ``kind`` names the handler that computes it (for a list of
    compatible jobs at once, a result each, in order); ``key`` says which jobs may share a
    batch."""

    kind: str
    key: tuple
    payload: dict
    future: asyncio.Future | None = None
    cancelled: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    submitted: float = field(default_factory=time.perf_counter)


class Batcher:
    def __init__(self, name: str, handlers: dict[str, Callable[[list[Job]], list]], *,
                 max_batch: int = 16, max_wait_ms: float = 5.0, max_queue: int = 256) -> None:
        self.name, self.handlers = name, handlers
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait_ms / 1000, max_queue
        self.queue: deque[Job] = deque()
        self.lock = threading.Lock()  # jobs arrive from the event loop's thread
        self.batches = self.jobs = self.cancelled = 0  # served so far (for /health)

    def submit(self, job: Job) -> None:
        """Queue a job (any thread); Busy when ``max_queue`` jobs already wait."""
        with self.lock:
            if len(self.queue) >= self.max_queue:
                raise Busy(f"model {self.name!r} has {len(self.queue)} requests waiting; "
                           "try again shortly")
            self.queue.append(job)

    @property
    def waiting(self) -> int:
        return len(self.queue)

    def due_in(self, now: float) -> float | None:
        """Seconds until the next batch is due (0: now); None without jobs."""
        with self.lock:
            if not self.queue:
                return None
            first, n = self.queue[0], self._front()
            if n >= self.max_batch or n < len(self.queue):  # full, or closed by another kind
                return 0.0
            return max(0.0, first.submitted + self.max_wait - now)

    def step(self) -> list[tuple[Job, object]]:
        """In the models' thread: run the batch at the queue's front; each of its jobs with
        its result (or the exception it failed with alone)."""
        with self.lock:
            batch = [self.queue.popleft() for _ in range(self._front())]
        live = [job for job in batch if not job.cancelled]
        self.cancelled += len(batch) - len(live)
        if not live:
            return []
        try:
            results = self.handlers[live[0].kind](live)
        except Exception as e:  # one bad job must not fail the others: each runs alone
            traceback.print_exc()
            results = [e] if len(live) == 1 else [self._alone(job) for job in live]
        self.batches += 1
        self.jobs += len(live)
        return list(zip(live, results, strict=True))

    def _front(self) -> int:
        """How many jobs at the queue's front form the next batch (under the lock)."""
        key, n = self.queue[0].key, 0
        while n < min(len(self.queue), self.max_batch) and self.queue[n].key == key:
            n += 1
        return n

    def _alone(self, job: Job):
        try:
            return self.handlers[job.kind]([job])[0]
        except Exception as e:
            return e


def settle(future: asyncio.Future, result) -> None:
    """In the event loop: a job's future gets its result (or its exception)."""
    if future.done():
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)
