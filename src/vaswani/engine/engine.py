"""The inference engine: requests in, tokens out, many requests at once.

``Engine.step()`` runs one scheduler step (scheduler.py): encode the sources of newly
admitted translation requests, prefill prompt chunks (shortest first, rows of like lengths
together: ``prefill_groups``), decode one token for every running row, then choose each row's
next token, report it, and retire what finished. Requests join and leave the running batch
at every step (continuous batching); none waits for another to end.

Tokens are chosen exactly as the reference decoders of generation/ choose them for one
request alone (greedy, or sampled with the request's own generator; the decoding rules of
rules.py; GNMT beam search with generation/search.py ``Beam``), so a request's output does not
depend on what else the engine is running.

``Engine.run(requests)`` steps until they are all finished (the offline commands);
loop.py runs a server's engines in one thread of their own.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from ..generation.rules import Rules
from ..generation.sampling import sample_rows
from ..generation.search import Beam
from ..models import EncoderDecoder
from . import beam
from .cache import SlotCache
from .graphs import StaticDecoder
from .memory import collector_paused, keep_freed_memory
from .request import Params, Request, Sequence, Status
from .runner import Runner
from .scheduler import Scheduler

FAST_LANE = 32  # a CPU's fast lane: requests of at most this many tokens (scheduler.py)
GATHER = 8  # an offline run admits new requests once 1/GATHER of its rows are free


def fast_lane_for(device: torch.device) -> int:
    """The fast lane's default: on a CPU, where a step costs about its rows; none on a GPU,
    where a step of many rows costs what a step of one does (scheduler.py)."""
    return FAST_LANE if device.type == "cpu" else 0


@dataclass(frozen=True)
class EngineConfig:
    """The engine's size."""

    max_rows: int = 64  # sequences decoded together at most (a beam search takes `beam`)
    max_step_tokens: int = 1024  # prompt tokens prefilled in one step at most (longer: chunks);
    # also the padded positions of one encoder pass at most (a longer source: a pass alone)
    cache_tokens: int = 0  # token positions the cache holds, all rows and sources together;
    # 0: max_rows full-length rows (and their sources), within cache_bytes
    cache_bytes: int = 1 << 30  # the cache's memory at most, when cache_tokens is 0
    cuda_graphs: bool = True  # on a GPU: decode steps as CUDA graphs (graphs.py)
    fast_lane: int | None = None  # requests of at most this many tokens decoded at every
    # step, the others at every other step while they run (scheduler.py); None: 32 on a CPU,
    # 0 (no lane) on a GPU

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_step_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")
        if self.fast_lane is not None and self.fast_lane < 0:
            raise ValueError(f"fast_lane ({self.fast_lane}) must be 0 (none) or more")


class Engine:
    def __init__(self, model: torch.nn.Module, *, bos_id: int, eos_id: int,
                 config: EngineConfig = EngineConfig()) -> None:
        c = model.config
        self.model, self.config = model, config
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, c.pad_id
        self.max_len = c.max_len
        self.seq2seq = isinstance(model, EncoderDecoder)
        param = next(model.parameters())
        self.device = param.device
        if self.device.type == "cpu":  # each step's tensors reused, not faulted in again
            keep_freed_memory()
        layers = c.n_decoder_layers
        head_dim = c.d_model // c.n_heads
        per_token = 2 * layers * c.n_kv_heads * head_dim * param.element_size()
        self.cache = SlotCache(layers, c.n_kv_heads, head_dim,
                               tokens=config.cache_tokens or config.cache_bytes // per_token,
                               max_rows=config.max_rows, max_len=self.max_len,
                               seq2seq=self.seq2seq, dtype=param.dtype, device=self.device)
        lane = fast_lane_for(self.device) if config.fast_lane is None else config.fast_lane
        self.scheduler = Scheduler(self.cache, max_rows=config.max_rows,
                                   max_step_tokens=config.max_step_tokens,
                                   max_len=self.max_len, fast_lane=lane)
        static = None
        if config.cuda_graphs and self.device.type == "cuda":
            static = StaticDecoder(model, self.cache, pad_id=self.pad_id, capture=True)
        self.runner = Runner(model, self.cache, pad_id=self.pad_id, static=static)
        self.tokens_out = 0  # tokens generated so far (for throughput)
        self.steps = 0

    # --- requests in ----------------------------------------------------------------------
    def submit(self, request: Request) -> Request:
        """Queue a request; it runs from the next step. Raises ValueError for a request that
        cannot run (a seed out of range, a source or target past ``max_len``)."""
        p = request.params
        if request.seq2seq and len(request.prompt) > self.max_len:
            raise ValueError(f"the source is {len(request.prompt)} tokens; the model takes "
                             f"{self.max_len} at most")
        if request.seq2seq:  # the target holds <bos> too
            request.limit = max(1, min(request.limit, self.max_len - len(request.start)))
        elif request.sequences[0].context > self.max_len:  # a prompt past max_len slides
            self.scheduler.slide(request.sequences[0])  # before anything is cached
        if p.seed is not None and request.generator is None:
            if not 0 <= p.seed < 2**63:
                raise ValueError(f"seed ({p.seed}) must be in [0, 2**63)")
            request.generator = torch.Generator(self.device).manual_seed(p.seed)
        if p.beam and request.beam is None:
            rules = p.rules
            request.beam = Beam(p.beam, request.limit, eos_id=self.eos_id,
                                alpha=p.length_penalty, bounded=rules.presence_penalty >= 0
                                and rules.frequency_penalty >= 0, n_best=p.n_best)
        self.scheduler.add(request)
        return request

    def take_back(self) -> list[Request]:
        """Every request out of the engine, its slots freed, ready to be submitted again
        where it stands (nothing of it cached; its tokens, generator and beam kept)."""
        requests = [*self.scheduler.running, *self.scheduler.waiting]
        for request in requests:
            self.scheduler.finish(request)
            request.status = Status.WAITING
            request.recomputed = True
            for seq in request.sequences:
                seq.cached = 0
        return requests

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

    def stats(self) -> dict:
        s = self.scheduler
        return {"waiting": len(s.waiting), "running": len(s.running), "rows": s.rows,
                "slots_used": self.cache.used, "slots": self.cache.rows,
                "slot_width": self.cache.width,
                "preemptions": s.preemptions, "tokens_out": self.tokens_out,
                "steps": self.steps}

    # --- one step -------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[Request]:
        """Run one scheduler step; returns the requests that finished in it."""
        self.steps += 1
        finished = []
        for request in [*self.scheduler.running, *self.scheduler.waiting]:
            if request.cancelled:
                self._finish(request, "cancelled", finished)
        plan = self.scheduler.plan()
        for request in self.scheduler.failed:
            self._finish(request, "error", finished)
        self.scheduler.failed.clear()
        self.cache.compact()
        for group in length_groups(plan.encode, lambda request: len(request.prompt),
                                   tokens=self.config.max_step_tokens):
            self.runner.encode(group)  # sources of like lengths together, as prefills
        for group in prefill_groups(plan.prefill):  # first tokens go out before the decode
            logits = self.runner.forward(group)
            due = []
            for i, (_, seq, n) in enumerate(group):
                seq.cached += n
                if not seq.pending:  # the whole context is in: its next token is due
                    due.append(i)
            if due:
                self._advance([group[i][:2] for i in due], logits, due, finished)
        if plan.decode:
            self.cache.compact()  # rows that finished in the prefill left holes
            logits, at = self.runner.decode(plan.decode)
            for _, seq in plan.decode:
                seq.cached += 1
            self._advance(plan.decode, logits, at, finished)
        return finished

    def run(self, requests: list[Request], progress=None) -> None:
        """Submit ``requests`` and step until every one has finished; ``progress(n)`` is told
        how many finished in each step."""
        for request in requests:
            self.submit(request)
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

    # --- tokens out -------------------------------------------------------------------------
    def _advance(self, rows: list[tuple[Request, Sequence]], logits: Tensor, at: list[int],
                 finished: list) -> None:
        """Choose the next token of every due row and move its request on: row i's logits
        are ``logits[at[i]]``."""
        singles = sorted((i for i, (r, _) in enumerate(rows) if r.beam is None),
                         key=at.__getitem__)  # in the logits' order: often all of them, as is
        if singles:
            chosen = [rows[i] for i in singles]
            tokens = self._choose(chosen, self._rows_of(logits, [at[i] for i in singles]))
            for (request, seq), token in zip(chosen, tokens.tolist(), strict=True):
                self._extend(request, seq, token, finished)
        searches: dict[int, list[int]] = {}  # a beam search's rows, in its hypotheses' order
        for i, (r, _) in enumerate(rows):
            if r.beam is not None:
                searches.setdefault(r.id, []).append(i)
        forks: list[tuple[int, int, int, int]] = []  # (slot, parent's slot, keys it holds
        # already, keys to copy)
        if searches:
            order = [i for index in searches.values() for i in index]
            self._search([[rows[i] for i in index] for index in searches.values()], logits,
                          [at[i] for i in order], finished, forks)
        if forks:  # every search's copies at once
            self.cache.fork(forks)

    @staticmethod
    def _rows_of(logits: Tensor, index: list[int]) -> Tensor:
        """``logits[index]``: the tensor itself (not a copy) when that is all of it, in order,
        which the caller may then change in place."""
        if index == list(range(logits.size(0))):
            return logits
        return logits.index_select(0, torch.tensor(index, device=logits.device))

    def _scores(self, rows: list[tuple[Request, Sequence]], logits: Tensor, log: bool,
                at: list[int] | None = None) -> Tensor:
        """Next-token scores from ``logits`` (N, V), changed in place (the caller's own
        tensor): <pad> and <bos> never chosen, each of ``rows`` (its logits ``logits[at[i]]``;
        without ``at``, row i's are ``logits[i]``) with its request's rules applied with the
        history its reference decoder gives them; log-probabilities with ``log``."""
        scores = logits.to(torch.promote_types(logits.dtype, torch.float32))
        for never in (self.pad_id, self.bos_id):  # a column each: indexing by a list of
            scores[:, never] = float("-inf")  # them is a scatter, 0.18 ms at 256 rows
        if log:
            scores = scores.log_softmax(-1)
        groups: dict[Rules, list[int]] = {}
        for i, (request, _) in enumerate(rows):
            if request.params.rules.active:
                groups.setdefault(request.params.rules, []).append(i)
        for rules, index in groups.items():  # only the histories the rules read
            these = [rows[i] for i in index]
            histories = outputs = None
            if rules.reads_sequence:
                histories = self._pad([s.tokens[r.history_start:] for r, s in these])
            if rules.reads_generated:
                outputs = self._pad([s.tokens[len(r.start):] for r, s in these])
            lengths = None  # min_length reads how many tokens each row has made
            if rules.min_length:
                lengths = torch.tensor([len(s.tokens) - len(r.start) for r, s in these],
                                       device=self.device)
            where = index if at is None else [at[i] for i in index]
            scores[where] = rules.apply(scores[where], histories, outputs, eos_id=self.eos_id,
                                        pad_id=self.pad_id, lengths=lengths)
        return scores

    def _pad(self, rows: list[list[int]]) -> Tensor:
        width = max(1, max(len(r) for r in rows))
        return torch.tensor([r + [self.pad_id] * (width - len(r)) for r in rows],
                            dtype=torch.long, device=self.device)

    def _choose(self, rows: list[tuple[Request, Sequence]], logits: Tensor) -> Tensor:
        params = [r.params for r, _ in rows]
        return sample_rows(self._scores(rows, logits, log=False),
                           torch.tensor([p.temperature for p in params], device=self.device),
                           torch.tensor([p.top_k for p in params], device=self.device),
                           torch.tensor([p.top_p for p in params], device=self.device),
                           [r.generator for r, _ in rows])

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
        if stop or request.generated >= request.limit:
            self._finish(request, "stop" if stop else "length", finished)

    def _search(self, searches: list[list[tuple[Request, Sequence]]], logits: Tensor,
                at: list[int], finished: list, forks: list[tuple[int, int, int, int]]
                ) -> None:
        """A step of every beam search due (their rows search after search, row i's logits
        ``logits[at[i]]``): their candidates scored and ranked together (one log-softmax and
        one top-k for all the logits, whatever their order: beam.py ``rank``), then each
        search's generation/search.py ``Beam`` picks its finished and live hypotheses, and
        beam.py ``place`` gives the live ones their slots (the copies they need: ``forks``)."""
        if 2 * len(at) < logits.size(0):  # a few searches among many rows: theirs alone
            logits, at = self._rows_of(logits, at), list(range(len(at)))
        logp = self._scores([row for rows in searches for row in rows], logits, log=True,
                            at=at)
        V = logp.size(-1)
        ranked = beam.rank([len(rows) for rows in searches],
                           [rows[0][0].beam.K for rows in searches],
                           [s.score for rows in searches for _, s in rows], logp, at)
        for rows, (top_scores, top_index) in zip(searches, ranked, strict=True):
            request = rows[0][0]
            n = request.beam.candidates(len(rows) * V)
            histories = [s.tokens[len(request.start):] for _, s in rows]
            alive = request.beam.advance(len(histories[0]) + 1, top_scores[:n],
                                         top_index[:n], V, histories)
            self.tokens_out += len(rows)
            request.first_token = request.first_token or time.perf_counter()
            if request.beam.done:
                self._finish(request, "stop", finished)
            else:
                beam.place(self.cache, request, [s for _, s in rows], alive, forks)

    def _finish(self, request: Request, reason: str, finished: list) -> None:
        if request.status is Status.FINISHED:
            return
        self.scheduler.finish(request)
        request.reason, request.finished = reason, time.perf_counter()
        finished.append(request)
        if request.on_finish is not None:
            request.on_finish(request)


def prefill_groups(rows: list[tuple[Request, Sequence, int]], slack: int = 32
                   ) -> list[list[tuple[Request, Sequence, int]]]:
    """Prefill rows (each feeding ``n`` tokens) in groups that run as one padded forward
    pass each, shortest first (:func:`length_groups`)."""
    return length_groups(rows, lambda row: row[2], slack)


def length_groups(items: list, length, slack: int = 32, tokens: int | None = None
                  ) -> list[list]:
    """``items`` in groups that run as one padded pass each, shortest first: an item joins the
    group before it while the padding that costs stays within a quarter of the group's
    tokens and ``slack`` more, and (with ``tokens``) the pass stays within ``tokens`` padded
    positions. Prompts of 5 and 200 tokens padded together would compute 400 positions for
    205 tokens; apart, 205, for one more pass. ``length(item)``: its tokens.

    ``tokens`` bounds the encoder's passes (the engine's ``max_step_tokens``), and with them
    its activations: 300 sources of the demo model admitted at once made passes of up to
    7,728 positions, a feed-forward layer's activations 16 MB each; 200 sources of up to
    160 tokens translated in one call peaked at 850 MB of memory, in passes of 1,024
    positions at 710 MB, in the same time (2-core Xeon)."""
    groups: list[list] = []
    real = 0  # the last group's real tokens
    for item in sorted(items, key=length):
        n = length(item)  # the longest so far: the group is padded to it
        padded = (len(groups[-1]) + 1) * n if groups else 0
        if groups and padded - (real + n) <= (real + n) // 4 + slack and (
                tokens is None or padded <= tokens):
            groups[-1].append(item)
            real += n
        else:
            groups.append([item])
            real = n
    return groups


__all__ = ["Engine", "EngineConfig", "Params", "Request"]
