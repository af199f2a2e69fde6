"""A request to the engine and its sequences (the rows of the engine's batches).

A request is one prompt to continue (a language model) or one source to translate, with how
to decode it (:class:`Params`). It decodes as one :class:`Sequence` (greedy or sampled), or,
with beam search, as up to ``beam`` sequences, its live hypotheses. The engine reports to it
through two hooks: ``on_token(request, token) -> bool`` after each new token of a one-row
request (return True to end it there: a stop string), and ``on_finish(request)``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch

from ..config.sections import MAX_SEED
from ..cpu.quantized import WIDEN_FROM
from ..generation.grammar import Constraint
from ..generation.rules import Rules
from ..generation.search import Beam

_ids = itertools.count()


@dataclass(frozen=True)
class Params:
    """How one request decodes."""

    max_new_tokens: int  # tokens to generate at most
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None  # a seeded request draws from its own generator
    rules: Rules = field(default_factory=Rules)  # penalties, n-gram blocks, min length
    beam: int = 0  # > 0: beam search with this many hypotheses (translation)
    n_best: int = 1  # beam search: hypotheses returned
    length_penalty: float = 0.0  # beam search: GNMT alpha
    logprobs: int | None = None  # one-row requests: keep each chosen token's log-probability
    # (the model's own, before temperature, top-k/top-p and rules) and this many of the most
    # likely tokens' (Request.logprobs)
    speculate: int = 0  # one-row requests: tokens guessed from the context and verified in
    # one pass with the request's own (speculate.py); 0 = off


@dataclass
class Acceptance:
    """Tokens guessed for a request and how many of them held (speculate.py)."""

    guessed: int = 0
    accepted: int = 0
    passes: int = 0  # forward passes that verified guesses
    window: int = 0  # tokens to guess next (0: as many as asked), as guesses fare
    firsts_held: int = 0  # passes whose first guess held
    chained: int = 0  # guesses checked after one that held ...
    chained_held: int = 0  # ... and those that held too

    def add(self, guessed: int, accepted: int) -> None:
        self.guessed += guessed
        self.accepted += accepted
        self.passes += 1
        if accepted:
            self.firsts_held += 1
            self.chained += min(accepted, guessed - 1)
            self.chained_held += accepted - 1
        # a guess that held whole: guess two more next time; else one fewer (Hugging Face's
        # schedule for assisted generation): a pass costs more for each place it checks
        self.window = guessed + 2 if accepted == guessed else max(1, guessed - 1)

    def expected(self, k: int) -> float:
        """The tokens a pass that guesses ``k`` is expected to make: its own, and each guess
        that holds, the first with the share of first guesses that held so far and each
        next with the share of guesses after a held one that held (one prior success and
        failure each: a row with no history expects half)."""
        first = (self.firsts_held + 1) / (self.passes + 2)
        after = (self.chained_held + 1) / (self.chained + 2)
        return 1 + first * sum(after ** i for i in range(k))

    @property
    def rate(self) -> float:
        """The share of guessed tokens that held (0 before any guess)."""
        return self.accepted / self.guessed if self.guessed else 0.0

    def as_dict(self) -> dict:
        return {"guessed": self.guessed, "accepted": self.accepted, "passes": self.passes,
                "acceptance": round(self.rate, 4)}


class Status(Enum):
    WAITING = "waiting"  # not admitted, or preempted: nothing of it is cached
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One row: the tokens it has seen (a language model's prompt and output; a translation's
    ``<bos>`` and output), how many of them are in the cache, and the cache slot holding them.

    A language model's context is ``tokens[offset:]``: past ``max_len`` it slides (the
    offset moves on, the cache is dropped and the new context recomputed), and its positions
    count from the offset."""

    def __init__(self, tokens: list[int], score: float = 0.0) -> None:
        self.tokens = tokens
        self.offset = 0  # where the context starts (sliding window)
        self.cached = 0  # tokens of the context whose keys and values are in the cache
        self.slot = -1  # its slot in the engine's cache (cache.py), -1 when it has none
        self.score = score  # beam search: the hypothesis' log-probability

    @property
    def context(self) -> int:
        """Tokens in the context."""
        return len(self.tokens) - self.offset

    def uncached(self) -> list[int]:
        """The context tokens whose keys and values the cache still lacks."""
        return self.tokens[self.offset + self.cached:]

    @property
    def pending(self) -> int:
        """How many context tokens the cache still lacks (``len(uncached())``, no copy)."""
        return len(self.tokens) - self.offset - self.cached


class Request:
    """One prompt (or source) and everything the engine knows of it."""

    def __init__(self, prompt: list[int], params: Params, *, start: list[int] | None = None,
                 history_start: int = 0, limit: int | None = None,
                 on_token: Callable[[Request, int], bool] | None = None,
                 on_finish: Callable[[Request], None] | None = None,
                 adapter: int = 0, constraint: Constraint | None = None) -> None:
        """``prompt``: a language model's prompt, or a translation's source ids (then
        ``start`` is the target's first tokens, ``[<bos>]``). ``history_start``: where in a
        row's tokens the text that repetition rules look at begins (a translation's output
        after ``<bos>``). ``limit``: tokens to generate at most (default
        ``params.max_new_tokens``). ``adapter``: which of the model's LoRA adapters its rows
        use, where it serves several (adapters.py; 0: the base alone). ``constraint``: the
        grammar its output keeps to (generation/grammar.py; one-row requests)."""
        if constraint is not None and params.beam:
            raise ValueError("a beam search's output cannot be held to a grammar")
        self.id = next(_ids)
        self.prompt, self.params, self.adapter = prompt, params, adapter
        self.constraint = constraint
        self.seq2seq = start is not None
        self.start = list(start if start is not None else prompt)
        self.history_start = history_start
        self.limit = params.max_new_tokens if limit is None else limit
        self.on_token, self.on_finish = on_token, on_finish
        self.status = Status.WAITING
        self.sequences = [Sequence(list(self.start))]
        self.spares: list[Sequence] = []  # beam search: slots held for hypotheses to come
        self.block_names: list[bytes] = []  # its row's blocks of tokens named (prefixes.py)
        self.source_slot = -1  # a translation's source slot in the engine's cache
        self.beam: Beam | None = None  # beam search: made by the engine, which knows <eos>
        self.generator: torch.Generator | None = None  # made on the model's device
        self.cancelled = False
        # its prompt's int8 products widened to bfloat16 (EngineConfig.bf16_prefill, for a
        # prompt of cpu/quantized.py WIDEN_FROM tokens or more): its prompt tokens are
        # computed widened and its generated ones by the int8 kernel, whatever pass
        # carries them (runner.py), so that its bits are the same alone and in any batch
        self.wide = False
        self.recomputed = False  # its rows' keys computed again row by row (a preemption, a
        # slide, a move to another engine): a beam search's slots no longer hold a shared
        # prefix bit for bit (beam.py ``shared``)
        self.reason: str | None = None  # why it finished: "stop", "length", "cancelled", ...
        self.error: BaseException | None = None  # what failed it, if anything did
        self.generated = 0  # tokens generated (one-row requests)
        # with params.logprobs: per chosen token (<eos> included), (its log-probability,
        # [(token, log-probability) of the params.logprobs most likely])
        self.logprobs: list[tuple[float, list[tuple[int, float]]]] = []
        self.speculation = Acceptance()  # its guesses and how many held (speculate.py)
        self.arrived = time.perf_counter()
        self.first_token: float | None = None  # when its first token came
        self.finished: float | None = None

    @classmethod
    def translation(cls, source: list[int], params: Params, *, bos_id: int, max_len_a: float,
                    max_len_b: int) -> Request:
        """A request to translate ``source`` (ids, ``<eos>`` included): from ``<bos>``, at
        most ``max_len_a * len(source) + max_len_b`` tokens."""
        limit = max(1, int(len(source) * max_len_a + max_len_b))
        return cls(source, params, start=[bos_id], history_start=1, limit=limit)

    def prepare(self, *, max_len: int, eos_id: int, device: torch.device,
                widen: bool = False) -> None:
        """Ready it for an engine of a model of ``max_len`` positions on ``device``: its
        limit within the target's room, its generator and its beam search made, its prompt
        widened where the engine ``widen``s prompts and it is long enough. Raises
        ValueError if it cannot run (a seed out of range, a source past ``max_len``)."""
        p = self.params
        self.wide = widen and not self.seq2seq and len(self.prompt) >= WIDEN_FROM
        if self.seq2seq and len(self.prompt) > max_len:
            raise ValueError(f"the source is {len(self.prompt)} tokens; the model takes "
                             f"{max_len} at most")
        if self.seq2seq:  # the target holds <bos> too
            self.limit = max(1, min(self.limit, max_len - len(self.start)))
        if p.seed is not None and self.generator is None:
            if not 0 <= p.seed <= MAX_SEED:
                raise ValueError(f"seed ({p.seed}) must be in [0, {MAX_SEED}]")
            self.generator = torch.Generator(device).manual_seed(p.seed)
        if p.beam and self.beam is None:
            bounded = p.rules.presence_penalty >= 0 and p.rules.frequency_penalty >= 0
            self.beam = Beam(p.beam, self.limit, eos_id=eos_id, alpha=p.length_penalty,
                             bounded=bounded, n_best=p.n_best)

    def prompt_pending(self, seq: Sequence) -> int:
        """How many of a row's uncached tokens are its prompt's (a language model's: a
        prompt being prefilled, or recomputed after a preemption or a slide); 0 for a
        translation, whose prompt is its source."""
        if self.seq2seq:
            return 0
        return max(0, min(len(self.start) - seq.offset - seq.cached, seq.pending))

    @property
    def output(self) -> list[int]:
        """The generated tokens of a one-row request (without ``<eos>``)."""
        seq = self.sequences[0]
        return seq.tokens[len(self.start):]

    def hypotheses(self, n: int | None = None) -> list[tuple[list[int], float]]:
        """A beam search's best hypotheses (ids, normalised score), best first; a one-row
        request's output with score 0."""
        if self.beam is None:
            return [(self.output, 0.0)]
        return self.beam.best(n or self.params.n_best)

    def cancel(self) -> None:
        """End it at the engine's next step (a client gone); safe from any thread."""
        self.cancelled = True
