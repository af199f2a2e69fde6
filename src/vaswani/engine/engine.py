"""The inference engine: requests in, tokens out, many requests at once.

``Engine.step()`` runs one scheduler step (scheduler.py): encode the sources of newly
admitted translation requests, prefill prompt chunks, decode one token for every running row,
then choose each row's next token, report it, and retire what finished. Requests join and
leave the running batch at every step (continuous batching); none waits for another to end.

Tokens are chosen exactly as the reference decoders of generation/ choose them for one
request alone (greedy, or sampled with the request's own generator; the decoding rules of
rules.py; GNMT beam search with generation/search.py ``Beam``), so a request's output does not
depend on what else the engine is running.

``Engine.run(requests)`` steps until they are all finished (the offline commands);
loop.py runs an engine in its own thread for the server.
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
from .cache import BlockManager, KVPool, fork
from .graphs import StaticDecoder
from .request import Params, Request, Sequence, Status
from .runner import Runner
from .scheduler import Scheduler


@dataclass(frozen=True)
class EngineConfig:
    """The engine's size."""

    max_rows: int = 64  # sequences decoded together at most (a beam search takes `beam`)
    max_step_tokens: int = 1024  # prompt tokens prefilled in one step at most (longer: chunks)
    block_size: int = 16  # tokens per cache block
    cache_tokens: int = 0  # tokens the cache holds; 0: max_rows full-length rows (and their
    # sources), within cache_bytes
    cache_bytes: int = 1 << 30  # the cache's memory at most, when cache_tokens is 0
    cuda_graphs: bool = True  # on a GPU: decode steps as CUDA graphs (graphs.py)

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_step_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")


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
        layers = c.n_decoder_layers
        head_dim = c.d_model // c.n_heads
        per_token = 2 * layers * c.n_kv_heads * head_dim * param.element_size()
        bs = config.block_size
        full = -(-self.max_len // bs) * (2 if self.seq2seq else 1)  # one row and its source
        tokens = config.cache_tokens or min(config.max_rows * full * bs,
                                            config.cache_bytes // per_token)
        n_blocks = max(-(-tokens // bs), 2 * full) + 1  # + the scratch block
        self.blocks = BlockManager(n_blocks, bs)
        self.pool = KVPool(layers, n_blocks, bs, c.n_kv_heads, head_dim, dtype=param.dtype,
                           device=self.device)
        self.scheduler = Scheduler(self.blocks, max_rows=config.max_rows,
                                   max_step_tokens=config.max_step_tokens,
                                   max_len=self.max_len)
        static = None
        if config.cuda_graphs and self.device.type == "cuda":
            static = StaticDecoder(model, self.pool, max_rows=config.max_rows,
                                   max_len=self.max_len, pad_id=self.pad_id,
                                   seq2seq=self.seq2seq, capture=True)
        self.runner = Runner(model, self.pool, block_size=bs, pad_id=self.pad_id,
                             static=static)
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
            self.scheduler.slide(request.sequences[0])
        if p.seed is not None and request.generator is None:
            if not 0 <= p.seed < 2**63:
                raise ValueError(f"seed ({p.seed}) must be in [0, 2**63)")
            request.generator = torch.Generator(self.device).manual_seed(p.seed)
        if p.beam and request.beam is None:
            rules = p.rules
            request.beam = Beam(p.beam, request.limit, eos_id=self.eos_id,
                                alpha=p.length_penalty, bounded=rules.presence_penalty >= 0
                                and rules.frequency_penalty >= 0)
        self.scheduler.add(request)
        return request

    def take_back(self) -> list[Request]:
        """Every request out of the engine, its blocks freed, ready to be submitted again
        where it stands (nothing of it cached; its tokens, generator and beam kept)."""
        requests = [*self.scheduler.running, *self.scheduler.waiting]
        for request in requests:
            self.scheduler.finish(request)
            request.status = Status.WAITING
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
                "blocks_used": self.blocks.used, "blocks": self.blocks.total,
                "preemptions": s.preemptions, "tokens_out": self.tokens_out,
                "steps": self.steps}

    # --- one step -------------------------------------------------------------------------
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
        if plan.encode:
            self.runner.encode(plan.encode)
        if plan.prefill:  # first tokens go out before the batch's decode runs
            logits = self.runner.forward(plan.prefill)
            chosen = []
            for (request, seq, n), row in zip(plan.prefill, logits, strict=True):
                seq.cached += n
                if not seq.uncached():  # the whole context is in: its next token is due
                    chosen.append((request, seq, row))
            if chosen:
                self._advance(chosen, finished)
        if plan.decode:
            logits = self.runner.decode(plan.decode)
            for _, seq in plan.decode:
                seq.cached += 1
            self._advance([(r, s, row) for (r, s), row in zip(plan.decode, logits, strict=True)],
                          finished)
        return finished

    def run(self, requests: list[Request], progress=None) -> None:
        """Submit ``requests`` and step until every one has finished; ``progress(n)`` is told
        how many finished in each step."""
        for request in requests:
            self.submit(request)
        while any(r.status is not Status.FINISHED for r in requests):
            done = self.step()
            if progress is not None and done:
                progress(len(done))

    # --- tokens out -------------------------------------------------------------------------
    def _advance(self, chosen: list[tuple[Request, Sequence, Tensor]], finished: list) -> None:
        """Choose the next token of every due row and move its request on."""
        singles = [(r, s, row) for r, s, row in chosen if r.beam is None]
        if singles:
            tokens = self._choose(singles).tolist()
            for (request, seq, _), token in zip(singles, tokens, strict=True):
                self._extend(request, seq, token, finished)
        beams: dict[int, list[tuple[Request, Sequence, Tensor]]] = {}
        for r, s, row in chosen:
            if r.beam is not None:
                beams.setdefault(r.id, []).append((r, s, row))
        for rows in beams.values():
            self._search(rows, finished)

    def _scores(self, rows: list[tuple[Request, Sequence, Tensor]], log: bool) -> Tensor:
        """Next-token scores (logits, or log-probabilities), <pad> and <bos> never chosen,
        each request's rules applied with the history its reference decoder gives them."""
        scores = torch.stack([row for _, _, row in rows])
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
        scores[:, [self.pad_id, self.bos_id]] = float("-inf")
        if log:
            scores = scores.log_softmax(-1)
        groups: dict[Rules, list[int]] = {}
        for i, (request, _, _) in enumerate(rows):
            if request.params.rules.active:
                groups.setdefault(request.params.rules, []).append(i)
        for rules, index in groups.items():
            histories = [rows[i][1].tokens[rows[i][0].history_start:] for i in index]
            outputs = [rows[i][1].tokens[len(rows[i][0].start):] for i in index]
            scores[index] = rules.apply(scores[index], self._pad(histories),
                                        self._pad(outputs), eos_id=self.eos_id,
                                        pad_id=self.pad_id)
        return scores

    def _pad(self, rows: list[list[int]]) -> Tensor:
        width = max(1, max(len(r) for r in rows))
        return torch.tensor([r + [self.pad_id] * (width - len(r)) for r in rows],
                            dtype=torch.long, device=self.device)

    def _choose(self, rows: list[tuple[Request, Sequence, Tensor]]) -> Tensor:
        params = [r.params for r, _, _ in rows]
        return sample_rows(self._scores(rows, log=False),
                           torch.tensor([p.temperature for p in params], device=self.device),
                           torch.tensor([p.top_k for p in params], device=self.device),
                           torch.tensor([p.top_p for p in params], device=self.device),
                           [r.generator for r, _, _ in rows])

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

    def _search(self, rows: list[tuple[Request, Sequence, Tensor]], finished: list) -> None:
        """A beam search's step: its live hypotheses' next tokens, forked into rows that
        share their parents' blocks."""
        request = rows[0][0]
        logp = self._scores(rows, log=True)
        scores = torch.tensor([s.score for _, s, _ in rows], dtype=torch.float64,
                              device=logp.device)
        histories = [s.tokens[len(request.start):] for _, s, _ in rows]
        length = len(histories[0]) + 1
        alive = request.beam.step(length, scores, logp, histories)
        self.tokens_out += len(rows)
        request.first_token = request.first_token or time.perf_counter()
        if request.beam.done:
            return self._finish(request, "stop", finished)
        parents = [s for _, s, _ in rows]
        taken: set[int] = set()
        children = []
        for row, token, score in alive:
            parent = parents[row]
            child = Sequence(parent.tokens + [token], score)
            child.cached = parent.cached
            if row in taken:  # a second child: share the full blocks, copy the last one
                child.table = fork(self.blocks, self.pool, parent.table, parent.cached)
            else:  # the first child takes its parent's blocks over
                child.table, taken = parent.table, taken | {row}
            children.append(child)
        for row, parent in enumerate(parents):
            if row not in taken:
                self.blocks.release(parent.table)
        request.sequences = children

    def _finish(self, request: Request, reason: str, finished: list) -> None:
        if request.status is Status.FINISHED:
            return
        self.scheduler.finish(request)
        request.reason, request.finished = reason, time.perf_counter()
        finished.append(request)
        if request.on_finish is not None:
            request.on_finish(request)


__all__ = ["Engine", "EngineConfig", "Params", "Request"]
