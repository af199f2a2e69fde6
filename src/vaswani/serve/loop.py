"""The server's models in a thread of their own: requests (and one-off calls such as the
attention explorer's) arrive from any thread; the thread steps every engine that has work, in
turn, runs each encoder's batches as they fall due (batcher.py), and sleeps when nothing is
due. Every use of the models happens in this one thread.

Why one thread for all of a server's models, rather than one each: on a CPU, PyTorch runs an
operator on a team of OpenMP threads, and each Python thread that runs operators gets a team of
its own. Once a process has more of those threads than cores, OpenMP stops letting them spin
between operators and puts them to sleep instead: every operator then pays for waking a thread
(docs/performance.md, "Serving"). One thread keeps one team. ``threads`` is how many the team
has. PyTorch's count is the process's, not a thread's: ``vaswani serve`` loads the models with
it set to 1 (cli/serve.py), so that loading makes no team in the server's thread, and this
thread then sets ``threads``; the server's thread runs none of the models' operators (every use
of a model comes here), so it makes no second team.

The engines share the thread by time, not by turns: the loop steps the busy engine that has
had the least of it since it last became busy (one that was idle starts level with the least
of the others), and a step of a long prompt's prefill counts three times its time, so a
model working through a long prompt gets a quarter of the thread while another model has
short work: a short translation on the other model is not held to one step per long one.
Nor does it wait for the long step in flight when it arrives: between two layers of a long
prefill's pass (engine/sharing.py ``between_layers``, :meth:`EngineLoop._yield_point`) the
loop takes what has arrived and steps the other models that are owed time, then the pass
goes on. A model's own requests wait for its pass (its cache is mid-write); another model's
share nothing with it.

A step that fails does not fail the requests in it: each of them is run again alone, and only
a request that fails alone gets the error; the others finish as if nothing happened.

What the requests' hooks hand to other threads (a server's streamed text, in its asyncio event
loop) goes through :meth:`EngineLoop.post`: held until the step ends, then passed on in one
call per event loop, so that a step of 32 streams wakes the server's thread once, not 32
times (a stream's first text goes at once: the time to the first token is not kept waiting
for the step's decode).
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future

from ..engine import Engine, Request
from ..engine.sharing import between_layers, long_step
from .batcher import Batcher, Busy, Job, settle

WAKE = object()  # an inbox item that only wakes the loop (an encoder's job has arrived)
LONG_WEIGHT = 3  # a long prefill's step counts this many times its time (a quarter of the share)


class EngineLoop:
    def __init__(self, engines: dict[str, Engine], *, batchers: dict[str, Batcher] | None = None,
                 max_queue: int = 256, threads: int | None = None) -> None:
        """``engines`` and an encoder's ``batchers`` by model name; ``threads``: PyTorch's
        threads in the loop's thread (default: as many as it has now)."""
        import torch

        self.engines, self.max_queue = dict(engines), max_queue
        self.batchers = dict(batchers or {})
        self.threads = threads or torch.get_num_threads()
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: dict = {}  # asyncio event loop -> [(fn, args), ...] posted this step
        self.queued: Counter[str] = Counter()  # requests in the inbox, by model
        self.used: dict[str, float] = dict.fromkeys(self.engines, 0.0)  # seconds stepping,
        # by model, since each last became busy (the loop steps the least used first)
        self.stepped: dict[str, int] = dict.fromkeys(self.engines, 0)  # when each last stepped
        self.steps = 0
        self.was_busy: set[str] = set()  # the engines busy at the last pick
        self.stepping: str | None = None  # the engine whose step runs now, since ``mark``
        self.mark = 0.0
        self.nested = False  # inside a yield point: a step there yields no further
        self.hooks = []  # a long prefill lets the other models step between its layers
        if len(self.engines) + len(self.batchers) > 1:
            for name, engine in self.engines.items():
                self.hooks += between_layers(engine, lambda name=name: self._yield_point(name))
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="vaswani-models", daemon=True)
        self.thread.start()

    def submit(self, name: str, requests: list[Request]) -> None:
        """Queue requests for the engine of model ``name`` (their hooks are called in the
        loop's thread), all or none: Busy, with none of them queued, when they would make
        more than ``max_queue`` wait for it."""
        with self.lock:
            if self.queued[name] + self.engines[name].waiting + len(requests) > self.max_queue:
                raise Busy(f"model {name!r} has {self.max_queue} requests waiting at most; "
                           "try again shortly")
            self.queued[name] += len(requests)
        for request in requests:
            self.inbox.put((name, request))

    def submit_job(self, name: str, job: Job) -> None:
        """Queue an encoder's job for the batcher of model ``name`` (its future is settled
        in its event loop); Busy when its queue is full."""
        self.batchers[name].submit(job)
        self.inbox.put(WAKE)

    def call(self, fn: Callable[[], object]) -> Future:
        """Run ``fn()`` in the loop's thread, between two steps."""
        future: Future = Future()
        self.inbox.put((fn, future))
        return future

    def post(self, loop, fn: Callable, *args, now: bool = False) -> None:
        """In the loop's thread (a request's hook): have ``fn(*args)`` called in the asyncio
        event loop ``loop``, after this step, in the order posted; ``now``: at once, with
        what was posted to that loop before it (a stream's first text, which should not wait
        for the rest of the step). From another thread: at once."""
        if threading.current_thread() is not self.thread:
            loop.call_soon_threadsafe(fn, *args)
            return
        self.outbox.setdefault(loop, []).append((fn, args))
        if now:
            self._deliver(loop)

    def _deliver(self, only=None) -> None:
        """Hand each event loop (or the one, ``only``) what was posted to it, in one call."""
        loops = list(self.outbox) if only is None else [only]
        for loop in loops:
            calls = self.outbox.pop(loop, [])
            try:
                loop.call_soon_threadsafe(_call_all, calls)
            except RuntimeError:  # that event loop is closed: nobody is waiting any more
                pass

    def stop(self) -> None:
        self.inbox.put(None)
        self.thread.join(timeout=30)
        for hook in self.hooks:  # the models outlive the server (a Run serves again)
            hook.remove()

    @property
    def busy(self) -> bool:
        return any(engine.busy for engine in self.engines.values())

    def _idle(self) -> float | None:
        """How long the loop may wait for new work: 0 while an engine is busy, until the
        next encoder batch falls due, or (None) until something arrives."""
        if self.busy:
            return 0.0
        now = time.perf_counter()
        due = [t for b in self.batchers.values() if (t := b.due_in(now)) is not None]
        return min(due, default=None)

    def _loop(self) -> None:
        import torch

        torch.set_num_threads(self.threads)
        torch.set_grad_enabled(False)
        while self._take_all(self._idle()):  # wait for work only when none is due
            name = self._pick()
            if name is not None:
                self._timed_step(name)
                if not self._take_all(0.0):  # what came meanwhile joins the next step
                    return
            self._batches()
            self._deliver()  # the batches' results, before the loop waits again

    def _batches(self) -> None:
        """Each encoder's batch that is due."""
        now = time.perf_counter()
        for batcher in self.batchers.values():
            if batcher.due_in(now) == 0.0:
                for job, result in batcher.step():
                    if job.future is not None and job.loop is not None:
                        self.post(job.loop, settle, job.future, result)

    def _pick(self) -> str | None:
        """The busy engine to step next: the one that has had the least time since it became
        busy (one that was idle starts level with the least of the others; of two level, the
        one that stepped longer ago: a newcomer first)."""
        now_busy = {name for name, engine in self.engines.items() if engine.busy}
        for name in now_busy - self.was_busy:
            self.used[name] = min((self.used[n] for n in self.was_busy & now_busy),
                                  default=0.0)
        self.was_busy = now_busy
        if not now_busy:
            return None
        return min(now_busy, key=lambda n: (self.used[n], self.stepped[n]))

    def _timed_step(self, name: str) -> None:
        """A step of engine ``name``, its time counted (a long prefill's LONG_WEIGHT times);
        the time it spent stopped at a yield point is not its own."""
        self.stepped[name] = self.steps = self.steps + 1
        outer = self.stepping, self.mark
        self.stepping, self.mark = name, time.perf_counter()
        try:
            self._step(self.engines[name])
        finally:
            self._charge()
            self.stepping, self.mark = outer
            if outer[0] is not None:
                self.mark = time.perf_counter()  # the outer step resumes now

    def _charge(self) -> None:
        """Count the time since ``mark`` to the engine stepping now."""
        name, now = self.stepping, time.perf_counter()
        long = long_step(self.engines[name])
        self.used[name] += (now - self.mark) * (LONG_WEIGHT if long else 1)
        self.mark = now

    def _yield_point(self, owner: str) -> None:
        """Between two layers of a forward pass of engine ``owner``: if that pass is a long
        prefill's, at the top of the loop, take what has arrived and step the other engines
        that are owed time (``_pick``) before the pass goes on. A model's other requests
        wait for its pass; another model's need not wait for its end."""
        if (self.stepping != owner or self.nested or not long_step(self.engines[owner])
                or threading.current_thread() is not self.thread):
            return
        self._charge()
        self.nested = True
        try:
            self._take_all(0.0)
            while (name := self._pick()) not in (None, owner):
                self._timed_step(name)
                self._take_all(0.0)
            self._batches()
            self._deliver()
        finally:
            self.nested = False
            self.mark = time.perf_counter()

    def _take_all(self, timeout: float | None) -> bool:
        """Take everything in the inbox (first waiting up to ``timeout`` seconds for an item;
        None: until one comes), then hand over what was posted since the last time (by a
        step's hooks, by a batch, or by a request refused as it was taken); False once told
        to stop."""
        try:
            item = self.inbox.get(block=timeout != 0.0, timeout=timeout or None)
            while item is not None:
                self._take(item)
                item = self.inbox.get_nowait()
            return False
        except queue.Empty:
            return True
        finally:
            self._deliver()

    def _take(self, item) -> None:
        if item is WAKE:  # an encoder's job: its batcher holds it
            return
        if isinstance(item[1], Request):
            name, request = item
            with self.lock:
                self.queued[name] -= 1
            try:
                self.engines[name].submit(request)
            except ValueError as e:  # a request that cannot run: its own error
                self.engines[name].fail(request, e)
            return
        fn, future = item
        try:
            future.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - the caller gets it
            future.set_exception(e)

    @staticmethod
    def _step(engine: Engine) -> None:
        try:
            engine.step()
        except Exception:  # one request may have broken the batch: retry each alone
            traceback.print_exc()
            _isolate(engine)


def _call_all(calls: list) -> None:
    """In the event loop: each call of a step's hand-over, one failing not stopping the
    others (each is another request's)."""
    for fn, args in calls:
        try:
            fn(*args)
        except Exception:
            traceback.print_exc()


def _isolate(engine: Engine) -> None:
    for request in engine.take_back():
        try:
            engine.run([request])
        except Exception as e:
            traceback.print_exc()
            engine.take_back()
            engine.fail(request, e)

