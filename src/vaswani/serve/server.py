"""The server's state and its model work: the loaded runs, the limits a request must keep, the
ways it refuses one (:class:`Refused`, :class:`UnknownModel`, batcher.py ``Busy``: app.py
answers each with its HTTP status), and where each run's work goes (the routes are
routes.py's).

A run that decodes (a translator, a language model) gets an inference engine: every
translation and completion is a request of that engine, joining the running batch at the next
step and leaving it as soon as it ends; its tokens come back to the event loop as they are
made. An encoder's work (classify, embed) is batched (batcher.py). Every model runs in one
thread, the loop's (loop.py says why): it steps each engine in turn, and runs an encoder's
batches and one-off jobs (the attention explorer) between steps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..config import DecodeConfig
from ..config.family import serving
from ..engine import EngineConfig, Request
from ..engine.sharing import stats
from ..generation.grammar import Constraint
from ..inference import Run
from ..inference.language_model import Completion
from . import schemas
from .batcher import Batcher, Job
from .loop import EngineLoop
from .metrics import Metrics

# A server's engines prefill at most this many prompt tokens a step: a step of a long prompt
# that a short request arrives during is one it must wait out, and smaller steps cost a whole
# prompt's prefill little more (docs/performance.md, "Serving").
SERVER_STEP_TOKENS = 256


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; past these it gets a 400 that names the limit."""

    max_input_chars: int = 20_000  # per text
    max_prompt_tokens: int = 4096  # tokens of a completion's prompt (rendered chat included)
    max_body_bytes: int = 2 << 20  # a request body, read no further (413)
    max_items: int = schemas.MAX_ITEMS  # texts or prompts per request
    max_tokens: int = 2048  # tokens generated per completion
    max_n: int = 8  # completions per prompt
    max_attention_tokens: int = 256  # tokens of the input (and target) of /v1/attention


class Refused(Exception):
    """A request that cannot be served as asked (a model of the wrong kind, input a run
    refuses); the message says why, ``param`` names the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


class UnknownModel(Refused):
    """No model of that name is loaded."""


class Server:
    """The loaded runs, their engines and batchers, and the limits."""

    def __init__(self, runs: dict[str, Run], *, max_batch: int, max_wait_ms: float,
                 max_queue: int, limits: Limits, threads: int | None = None,
                 fast_lane: int | None = None, prefix_cache_mb: int | None = None) -> None:
        """``threads``: PyTorch's threads in the models' thread (default: as many as this
        thread has)."""
        self.runs, self.limits, self.max_queue = runs, limits, max_queue
        kept = {} if prefix_cache_mb is None else {"prefix_bytes": prefix_cache_mb << 20}
        config = EngineConfig(max_rows=max_batch, fast_lane=fast_lane,
                              max_step_tokens=SERVER_STEP_TOKENS, **kept)
        # one engine per model: runs that share one (LoRA adapters over one base:
        # inference/shared.py) share its batches, stepped under the first one's name
        self.engines, self.stepped_as, made = {}, {}, {}  # made: model -> (name, engine)
        for name, run in runs.items():
            if run.decodes:
                if id(run.model) not in made:
                    made[id(run.model)] = name, run.new_engine(config)
                self.stepped_as[name], self.engines[name] = made[id(run.model)]
        self.batchers = {name: Batcher(name, self._handlers(run), max_batch=max_batch,
                                       max_wait_ms=max_wait_ms, max_queue=max_queue)
                         for name, run in runs.items() if not run.decodes}
        self.loop = EngineLoop(dict(made.values()), batchers=self.batchers,
                               max_queue=max_queue, threads=threads)
        self.submitted = dict.fromkeys(runs, 0)
        self.cancelled = dict.fromkeys(runs, 0)
        self.started = int(time.time())
        self.metrics = Metrics(self)

    def run_for(self, name: str, route: str) -> Run:
        if name not in self.runs:
            shown = name if len(name) <= 64 else f"{name[:60]}... ({len(name):,} characters)"
            raise UnknownModel(f"unknown model {shown!r}; loaded: {', '.join(self.runs)}",
                               "model")
        run = self.runs[name]
        family = serving(route)  # None: a route every run answers (attention, ...)
        if family is not None and route not in run.routes:
            raise Refused(f"model {name!r} is {run.describes}; /v1/{route} needs "
                          f"{family.describes}", "model")
        return run

    def served(self, name: str) -> dict:
        """What /health says of one model: requests, batches (engine steps), cancelled,
        waiting (and, for an engine, what it runs, how full its cache is and how its
        guesses fared: engine/speculate.py)."""
        if name in self.batchers:
            b = self.batchers[name]
            return {"batches": b.batches, "requests": b.jobs, "cancelled": b.cancelled,
                    "waiting": b.waiting}
        engine = self.engines[name]
        guesses = engine.speculation
        return {"batches": engine.steps, "requests": self.submitted[name],
                "cancelled": self.cancelled[name], **stats(engine),
                "guessed": guesses.guessed, "accepted": guesses.accepted,
                "guess_passes": guesses.passes}

    # --- work for a run that decodes (in the engines' thread) ------------------------------
    def _watch(self, name: str, requests: list[Request],
               events: asyncio.Queue | None = None) -> asyncio.Future:
        """A future done when all of ``requests`` have finished (and ``events`` then gets
        ("end", None), after every piece of text)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        left = [len(requests)]

        def finished(request: Request) -> None:  # in the engines' thread
            left[0] -= 1
            self.metrics.finished(name, request)
            if request.cancelled:
                self.cancelled[name] += 1
            if left[0] == 0:
                if events is not None:
                    self.loop.post(loop, events.put_nowait, ("end", None))
                self.loop.post(loop, lambda: done.done() or done.set_result(None))

        for request in requests:
            request.on_finish = finished
        return done

    def _queue(self, name: str, requests: list[Request]) -> None:
        """Hand requests to the engine, all or none (Busy: none of them)."""
        self.loop.submit(self.stepped_as[name], requests)
        self.submitted[name] += len(requests)

    async def translate(self, name: str, texts: list[str], decode: DecodeConfig,
                        gone: Gone | None = None) -> list:
        """``gone``: says whether the client has left (its requests are then cancelled)."""
        run = self.runs[name]
        requests = _answer(lambda: run.requests(texts, decode))
        if requests:
            every = list(requests.values())
            done = self._watch(name, every)
            self._queue(name, every)
            await until(done, gone, lambda: [r.cancel() for r in every])
        return _answer(lambda: run.results(texts, requests, decode))

    def generate(self, name: str, prompts: list[tuple[str, list[int]]], decode: DecodeConfig,
                 *, n: int, seed: int | None, stream: bool, logprobs: int | None = None,
                 constrain: Callable[[], Constraint] | None = None) -> list[Generation]:
        """``n`` completions of each prompt (text, its tokens), seeds ``seed``, ``seed + 1``,
        ..., queued all together or (Busy) not at all; streaming, each new piece of text goes
        to its generation's events as ("text", (index, piece, tokens so far)). ``logprobs``:
        keep each token's log-probability and this many alternatives'. ``constrain``:
        makes each completion's grammar (generation/grammar.py; bodies.py ``constraint``)."""
        generations = [self._generation(name, prompt, ids, decode, n=n, seed=seed,
                                        stream=stream, logprobs=logprobs, constrain=constrain)
                       for prompt, ids in prompts]
        self._queue(name, [c.request for g in generations for c in g.completions])
        return generations

    def _generation(self, name: str, prompt: str, ids: list[int], decode: DecodeConfig, *,
                    n: int, seed: int | None, stream: bool, logprobs: int | None,
                    constrain: Callable[[], Constraint] | None) -> Generation:
        run, loop = self.runs[name], asyncio.get_running_loop()
        events = asyncio.Queue() if stream else None

        completions: list[Completion] = []

        def emitter(index: int) -> Callable[[str], None] | None:
            if events is None:
                return None
            first = True

            def emit(piece: str) -> None:  # the first piece at once, the others per step
                nonlocal first
                made = len(completions[index].request.logprobs)  # the tokens this piece ends
                self.loop.post(loop, events.put_nowait, ("text", (index, piece, made)),
                               now=first)
                first = False
            return emit

        completions += [run.completion(prompt, decode, emit=emitter(k), ids=ids,
                                       seed=None if seed is None else seed + k,
                                       logprobs=logprobs,
                                       constraint=constrain() if constrain else None)
                        for k in range(n)]
        done = self._watch(name, [c.request for c in completions], events)
        return Generation(completions, done, events, run.source_tokenizer.eos_id, prompt)

    async def call(self, name: str, fn: Callable[[], object]):
        """Run one-off work with a run's model, in the thread that owns it (between steps)."""
        try:
            return await asyncio.wrap_future(self.loop.call(fn))
        except ValueError as e:
            raise Refused(str(e)) from None

    # --- work for an encoder (batched, in the loop's thread) ---------------------------------
    def _handlers(self, run: Run) -> dict:
        return {
            "classify": lambda jobs: _split(jobs, run.probabilities(
                [t for j in jobs for t in j.payload["texts"]])),
            "embed": lambda jobs: _split(jobs, list(run.embed(
                [t for j in jobs for t in j.payload["texts"]]))),
        }

    async def encode(self, name: str, kind: str, texts: list[str],
                     gone: Gone | None = None) -> list:
        """An encoder's batched work (``kind``: "classify" or "embed") on ``texts``."""
        loop = asyncio.get_running_loop()
        job = Job(kind, (kind,), {"texts": texts}, loop=loop, future=loop.create_future())
        self.loop.submit_job(name, job)

        def cancel() -> None:
            job.cancelled = True
        try:
            await until(job.future, gone, cancel)
            return job.future.result()
        except ValueError as e:
            raise Refused(str(e)) from None

    def close(self) -> None:
        self.loop.stop()


@dataclass
class Generation:
    """One prompt's completions running in an engine."""

    completions: list[Completion]
    done: asyncio.Future  # set when every one has finished
    events: asyncio.Queue | None  # streaming: ("text", (index, piece, tokens so far)) ...,
    # ("end", None)
    eos_id: int = -1
    prompt: str = ""

    def cancel(self) -> None:
        """The client went away: end them at the engine's next step."""
        for c in self.completions:
            c.request.cancel()

    def rest(self) -> list[tuple[int, str]]:
        """Streaming, at the end: each completion's text not sent yet (held back while it
        could still have become a stop string)."""
        return [(k, piece) for k, c in enumerate(self.completions) if (piece := c.text.finish())]

    def result(self) -> dict:
        """Once done: each completion's text, why it ended, the tokens counted, and with
        logprobs each chosen token and its log-probabilities."""
        choices = []
        for k, c in enumerate(self.completions):
            text = _answer(c.result)
            r = c.request
            choices.append({"index": k, "text": text, "completion_tokens": r.generated,
                            "finish_reason": "length" if r.reason == "length" else "stop",
                            "ids": chosen_ids(r, self.eos_id), "logprobs": r.logprobs})
        return {"prompt_tokens": len(self.completions[0].request.prompt), "prompt": self.prompt,
                "choices": choices}

    def finish_reasons(self) -> list[str]:
        return ["length" if c.request.reason == "length" else "stop" for c in self.completions]


def chosen_ids(request: Request, eos_id: int) -> list[int]:
    """The tokens a completion chose, its ending ``<eos>`` included (what its logprobs
    describe, one each)."""
    ids = list(request.output)
    return ids + [eos_id] if len(request.logprobs) > len(ids) else ids


def _answer(fn: Callable[[], object]):
    """``fn()``; a ValueError from it (the run refusing the input) :class:`Refused`."""
    try:
        return fn()
    except ValueError as e:
        raise Refused(str(e)) from None


class ClientGone(Exception):
    """The client closed its connection before its answer was ready; its work was
    cancelled."""


Gone = Callable[[], Awaitable[bool]]  # whether the client has closed its connection
POLL_S = 0.25  # how often a waiting request asks whether its client is still there


async def until(done: asyncio.Future, gone: Gone | None, cancel: Callable[[], object]) -> None:
    """Wait for ``done``; if the client goes away first (``gone``, asked every ``POLL_S``
    seconds), or the wait is cancelled, ``cancel()`` the work and raise :class:`ClientGone`
    (or the cancellation). A server does not work for nobody: a client that closes its
    socket before a long answer is ready stops that answer's work within ``POLL_S``."""
    try:
        while not done.done():
            try:
                await asyncio.wait_for(asyncio.shield(done), timeout=POLL_S)
            except TimeoutError:
                if gone is not None and await gone():
                    cancel()
                    raise ClientGone("the client closed its connection") from None
    except asyncio.CancelledError:
        cancel()
        raise
    if done.exception() is not None:
        raise done.exception()


def _split(jobs: list[Job], results: list) -> list:
    out, start = [], 0
    for job in jobs:
        n = len(job.payload["texts"])
        out.append(results[start: start + n])
        start += n
    return out
