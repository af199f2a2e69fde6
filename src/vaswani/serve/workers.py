"""An encoder's work off the event loop, with requests that arrive together batched (a
translator's or a language model's runs on its inference engine instead, serve/loop.py).

Each encoder has one :class:`Worker`: a thread that takes jobs from a bounded queue (a full
queue is a 503 for the caller), waits up to ``max_wait_ms`` for more jobs of the same kind (up
to ``max_batch`` of them), runs them as one batch (in the thread that runs every model of the
server, serve/loop.py, when it is given one), and hands each job its result back on the
event loop. A batch computes for each job what the job would get alone (classification and
embeddings are padding-invariant). A batch that fails is run again job by job, so only a job
that fails alone gets the error.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from .loop import Busy


@dataclass
class Job:
    """One request's work: ``kind`` names the worker's handler that computes it (for a list
    of compatible jobs at once, a result each, in order); ``key`` says which jobs may share a
    batch."""

    kind: str
    key: tuple
    payload: dict
    future: asyncio.Future | None = None
    cancelled: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    submitted: float = field(default_factory=time.perf_counter)


class Worker:
    def __init__(self, name: str, handlers: dict[str, Callable[[list[Job]], list]], *,
                 max_batch: int = 16, max_wait_ms: float = 5.0, max_queue: int = 256,
                 compute: Callable[[Callable[[], object]], Future] | None = None) -> None:
        """``compute(fn)``: runs ``fn`` where the models run and returns its future (None:
        in the worker's own thread)."""
        self.name, self.handlers, self.compute = name, handlers, compute
        self.max_batch, self.max_wait = max_batch, max_wait_ms / 1000
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.batches = self.jobs = self.cancelled = 0  # served so far (for /health)
        self.thread = threading.Thread(target=self._loop, name=f"vaswani-{name}", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise Busy(f"model {self.name!r} has {self.queue.qsize()} requests waiting; "
                       "try again shortly") from None

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        held: Job | None = None
        while True:
            job = held or self.queue.get()
            held = None
            if job is None:
                return
            batch = [job]
            deadline = time.perf_counter() + self.max_wait
            while len(batch) < self.max_batch:
                wait = deadline - time.perf_counter()
                try:
                    nxt = self.queue.get(timeout=wait) if wait > 0 else self.queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None or nxt.key != job.key:  # not batchable with these: next round
                    held = nxt
                    if nxt is None:
                        self.queue.put(None)
                        held = None
                    break
                batch.append(nxt)
            batch = [j for j in batch if not j.cancelled]
            if batch:
                self._run(batch)

    def _handle(self, batch: list[Job]) -> list:
        handler = self.handlers[batch[0].kind]
        if self.compute is None:
            return handler(batch)
        return self.compute(lambda: handler(batch)).result()

    def _run(self, batch: list[Job]) -> None:
        try:
            results = self._handle(batch)
        except Exception as e:  # one bad job must not fail the others: each runs alone
            traceback.print_exc()
            results = [e] if len(batch) == 1 else [self._alone(job) for job in batch]
        self.batches += 1
        self.jobs += len(batch)
        self.cancelled += sum(job.cancelled for job in batch)
        for job, result in zip(batch, results, strict=True):
            if job.future is not None and job.loop is not None:
                job.loop.call_soon_threadsafe(_settle, job.future, result)

    def _alone(self, job: Job):
        try:
            return self._handle([job])[0]
        except Exception as e:
            return e


def _settle(future: asyncio.Future, result) -> None:
    if future.done():
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)
