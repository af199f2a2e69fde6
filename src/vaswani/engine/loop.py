"""An engine in a thread of its own, for the server: requests (and one-off calls such as the
attention explorer's) arrive from any thread; the thread steps the engine while it has work
and sleeps when it has none. Every use of the model happens in this thread.

A step that fails does not fail the requests in it: each of them is run again alone, and only
a request that fails alone gets the error; the others finish as if nothing happened.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future

from .engine import Engine
from .request import Request, Status


class Busy(Exception):
    """Too many requests are waiting; the client should try again later."""


class EngineLoop:
    def __init__(self, engine: Engine, *, name: str = "engine", max_queue: int = 256) -> None:
        self.engine, self.name, self.max_queue = engine, name, max_queue
        self.inbox: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name=f"vaswani-{name}", daemon=True)
        self.thread.start()

    def submit(self, request: Request) -> None:
        """Queue a request (its hooks are called in the engine's thread); Busy when
        ``max_queue`` requests already wait."""
        if self.inbox.qsize() + len(self.engine.scheduler.waiting) >= self.max_queue:
            raise Busy(f"model {self.name!r} has {self.max_queue} requests waiting; try again "
                       "shortly")
        self.inbox.put(request)

    def call(self, fn: Callable[[], object]) -> Future:
        """Run ``fn()`` in the engine's thread, between two steps."""
        future: Future = Future()
        self.inbox.put((fn, future))
        return future

    def stop(self) -> None:
        self.inbox.put(None)
        self.thread.join(timeout=30)

    def _loop(self) -> None:
        import torch

        torch.set_grad_enabled(False)
        while True:
            try:  # wait for work only when there is none
                item = self.inbox.get(block=not self.engine.busy)
            except queue.Empty:
                item = ...
            while item is not ...:
                if item is None:
                    return
                self._take(item)
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    item = ...
            if self.engine.busy:
                self._step()

    def _take(self, item) -> None:
        if isinstance(item, Request):
            try:
                self.engine.submit(item)
            except ValueError as e:  # a request that cannot run: its own error
                fail(item, e)
            return
        fn, future = item
        try:
            future.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - the caller gets it
            future.set_exception(e)

    def _step(self) -> None:
        try:
            self.engine.step()
        except Exception:  # one request may have broken the batch: retry each alone
            traceback.print_exc()
            self._isolate()

    def _isolate(self) -> None:
        suspects = self.engine.take_back()
        for request in suspects:
            try:
                self.engine.run([request])
            except Exception as e:
                traceback.print_exc()
                self.engine.take_back()
                fail(request, e)


def fail(request: Request, error: BaseException) -> None:
    """Finish a request with an error (its ``on_finish`` hook sees ``request.error``)."""
    if request.status is Status.FINISHED:
        return
    request.error, request.reason, request.status = error, "error", Status.FINISHED
    if request.on_finish is not None:
        request.on_finish(request)
