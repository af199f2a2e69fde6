"""The inference engine: requests in, tokens out, many requests at once.

``Engine.step()`` runs one scheduler step (scheduler.py): encode the sources of newly
admitted translation requests, prefill prompt chunks (shortest first, rows of like lengths
together: ``prefill_groups``), decode one token for every running row (runner.py), then
choose each row's next token (sampler.py; a beam search's in beam.py), report it, and retire
what finished. Requests join and leave the running batch at every step (continuous
batching); none waits for another to end.

Tokens are chosen exactly as the reference decoders of generation/ choose them for one
request alone (greedy, or sampled with the request's own generator; the decoding rules of
rules.py; GNMT beam search with generation/search.py ``Beam``), so a request's output does not
depend on what else the engine is running.

``Engine.run(requests)`` steps until they are all finished (the offline commands);
serve/loop.py runs a server's engines in one thread of their own.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import Tensor

from ..models import EncoderDecoder
from . import beam, speculate
from .config import SOURCE_SHARE, SOURCE_SLACK, EngineConfig
from .graphs import captured
from .memory import collector_paused
from .request import Acceptance, Params, Request, Sequence, Status
from .runner import Runner
from .sampler import Sampler, rows_of
from .scheduler import GATHER, length_groups, prefill_groups


class Engine:
    def __init__(self, model: torch.nn.Module, *, bos_id: int, eos_id: int,
                 config: EngineConfig | None = None) -> None:
        c, config = model.config, config or EngineConfig()
        self.model, self.config = model, config
        self.bos_id, self.eos_id, self.pad_id, self.max_len = bos_id, eos_id, c.pad_id, c.max_len
        self.seq2seq = isinstance(model, EncoderDecoder)
        self.device = next(model.parameters()).device
        self.cache = config.cache_for(model, self.seq2seq)
        self.scheduler = config.scheduler_for(self.cache, self.max_len, self.device)
        static = captured(model, self.cache, config, self.device, pad_id=self.pad_id)
        self.runner = Runner(model, self.cache, pad_id=self.pad_id, static=static)
        self.sampler = Sampler(pad_id=self.pad_id, bos_id=bos_id, eos_id=eos_id,
                               device=self.device)
        self.tokens_out = self.steps = 0  # tokens generated and steps run so far (throughput)
        self.speculation = Acceptance()  # every request's guesses (speculate.py)
        # one-row passes timed on a CPU, which decide how many places a guess checks
        self.pass_costs = speculate.PassCosts() if self.device.type == "cpu" else None
        self.guesser = speculate.lookup  # how rows guess: speculate.py, or draft.py's

    # --- requests in ----------------------------------------------------------------------
    def submit(self, request: Request) -> Request:
        """Queue a request; it runs from the next step. Raises ValueError for a request that
        cannot run (a seed out of range, a source or target past ``max_len``)."""
        request.prepare(max_len=self.max_len, eos_id=self.eos_id, device=self.device,
                        widen=self.config.bf16_prefill)
        self.scheduler.add(request)
        return request

    def take_back(self) -> list[Request]:
        """Every request out, to be submitted again where it stands (scheduler.py)."""
        return self.scheduler.take_back()

    def fail(self, request: Request, error: BaseException) -> None:
        """Finish a request with an error (its ``on_finish`` hook sees ``request.error``),
        whether the engine holds it or not."""
        self._finish(request, "error", [], error)

    @contextlib.contextmanager
    def rows(self, n: int):
        """Decode at most ``n`` rows together while the block runs (an offline call's
        batch size)."""
        before, self.scheduler.max_rows = self.scheduler.max_rows, max(1, n)
        try:
            yield
        finally:
            self.scheduler.max_rows = before

    @property
    def busy(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    @property
    def waiting(self) -> int:  # requests submitted and not yet admitted
        return len(self.scheduler.waiting)

    # --- one step -------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[Request]:
        """Run one scheduler step; returns the requests that finished in it."""
        self.steps += 1
        finished = []
        for request in self.scheduler.cancelled():
            self._finish(request, "cancelled", finished)
        plan = self.scheduler.plan()
        for request in self.scheduler.failed:
            self._finish(request, "error", finished)
        self.scheduler.failed.clear()
        self.cache.compact()
        for group in length_groups(plan.encode, lambda request: len(request.prompt),
                                   SOURCE_SLACK, self.config.max_step_tokens, SOURCE_SHARE):
            self.runner.encode(group)  # sources of like lengths together, as prefills
        for group in prefill_groups(plan.prefill, self.config.prefill_slack):  # first tokens
            logits = self.runner.forward(group)
            due = []
            for i, (request, seq, n) in enumerate(group):
                self.scheduler.prefilled(request, seq, n)  # and its prompt kept, once in
                if not seq.pending:  # the whole context is in: its next token is due
                    due.append(i)
            if due:
                self._advance([group[i][:2] for i in due], logits, due, finished)
        if plan.decode:
            self.cache.compact()  # rows that finished in the prefill left holes
            plain, guessed = speculate.split(plan.decode, self.cache.width, self.max_len,
                                             self.guesser, self.pass_costs)
            if plain:
                alone = self.pass_costs if len(plain) == 1 and not guessed else None
                logits, at = speculate.timed(alone, 1, lambda: self.runner.decode(plain))
                for _, seq in plain:
                    self.scheduler.fed(seq, 1)
                self._advance(plain, logits, at, finished)
            if guessed:  # rows that feed guesses after their token (speculate.py)
                speculate.verify(self.runner, self.sampler, guessed, self.scheduler.fed,
                                 lambda r, s, token: self._extend(r, s, token, finished),
                                 self.speculation, self.pass_costs)
        self.scheduler.took(plan)  # the step's time, counted to its turn
        return finished

    def run(self, requests: list[Request], progress=None, *, longest_first: bool = False) -> None:
        """Submit ``requests`` and step until every one has finished; ``progress(n)`` is told
        how many finished in each step. ``longest_first``, as an offline call hands them in:
        as rows finish, the slots stay in order of length (cache.py ``compact``, ``parts``)."""
        for r in sorted(requests, key=lambda q: -len(q.prompt)) if longest_first else requests:
            self.submit(r)
        # made once, as wide as the rows and sources can grow (a translation's is its limit)
        self.cache.reserve(sum(max(1, r.params.beam) for r in requests),
                           max((len(r.start) + r.limit for r in requests), default=0),
                           max((len(r.prompt) for r in requests), default=0) * self.seq2seq)
        s = self.scheduler
        s.gather = max(1, s.max_rows // GATHER)  # new requests in groups (scheduler.py)
        try:
            with collector_paused():  # memory.py
                while any(r.status is not Status.FINISHED for r in requests):
                    done = self.step()
                    if progress is not None and done:
                        progress(len(done))
        finally:
            s.gather = 0
            self.cache.release()

    # --- tokens out -------------------------------------------------------------------------
    def _advance(self, rows: list[tuple[Request, Sequence]], logits: Tensor, at: list[int],
                 finished: list) -> None:
        """Choose the next token of every due row and move its request on: row i's logits
        are ``logits[at[i]]``."""
        singles = sorted((i for i, (r, _) in enumerate(rows) if r.beam is None),
                         key=at.__getitem__)  # in the logits' order: often all of them, as is
        if singles:
            chosen = [rows[i] for i in singles]
            tokens = self.sampler.choose(chosen, rows_of(logits, [at[i] for i in singles]))
            for (request, seq), token in zip(chosen, tokens.tolist(), strict=True):
                self._extend(request, seq, token, finished)
        done, searched = beam.search_rows(rows, logits, at, self.sampler, self.cache)
        self.tokens_out += searched
        for request in done:
            self._finish(request, "stop", finished)

    def _extend(self, request: Request, seq: Sequence, token: int, finished: list) -> None:
        """A one-row request's new token: the end at <eos>, at its limit, or when its
        ``on_token`` hook says so (a stop string)."""
        self.tokens_out += 1
        request.first_token = request.first_token or time.perf_counter()
        if token == self.eos_id:
            return self._finish(request, "stop", finished)
        seq.tokens.append(token)
        request.generated += 1
        stop = request.on_token is not None and request.on_token(request, token)
        # a text its grammar holds complete ends here (sampler.py: <eos> is all that may come)
        stop = stop or (request.constraint is not None and request.constraint.finished)
        if stop or request.generated >= request.limit:
            self._finish(request, "stop" if stop else "length", finished)

    def _finish(self, request: Request, reason: str, finished: list,
                error: BaseException | None = None) -> None:
        if self.scheduler.finish(request, reason, error):
            finished.append(request)
            if request.on_finish is not None:
                request.on_finish(request)


__all__ = ["Engine", "EngineConfig", "Params", "Request"]
