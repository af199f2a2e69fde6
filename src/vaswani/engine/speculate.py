"""Speculative decoding: a row feeds guessed tokens after its own, and one forward pass gives
the logits at every one of them; the tokens are then chosen one by one from those logits,
exactly as plain decoding would choose them, as long as each chosen token is the next guess.

At batch 1 a decode step reads every weight once to make one token, and costs about as much
for a few tokens (the weights are read once for all of them): each guess that holds is a
token for nothing. Nothing is approximated: the token at each place is chosen from that
place's logits by the request's own rule (greedy, or sampled with its own generator, its
decoding rules applied to the history so far), so a guess only decides how far one pass
gets. A wrong guess costs its share of the pass; the tokens after it are thrown away, and
their keys in the cache are past the row's length, overwritten by the next pass. Sampling
stays exact as well: the token is drawn from the model's distribution, and the guess is
kept only when the draw equals it (speculative sampling with a draft that is sure of its
guess). With layers that compute row by row (weight-only int8 and int4; runner.py), the
logits of a place are the same bits as plain decoding's, and so is every token; float32's
may differ in their last bits, and a token where two are tied.

The guesses come from the context itself (prompt lookup decoding, Saxena 2023): the last
``ngram`` tokens (down to ``shortest``) are looked for earlier in the context, and the
tokens that followed them there are the guess. Text that repeats its context (code edited,
a summary quoting its source, a list continued) is guessed well; other text makes no guess
and decodes plainly. One token seen before guesses badly (a pass costs more for each place
it checks, and most of those guesses fail), so a match is two tokens at least. The guesses
may come from a draft model instead (draft.py); the check is the same.

How many to guess: as many as asked while guesses hold whole, one fewer after a pass where
one failed (``Acceptance.window``), and, once the engine has timed its passes on this
machine (:class:`PassCosts`), the number within that which makes the most tokens per second
from the pass's cost and the row's acceptance so far. A checked place is far from free on
a CPU, and not evenly priced: a 4-bit pass of five places costs as much as one of eight on
an AVX-512 Xeon (docs/performance.md).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable

from .request import Acceptance, Request, Sequence, Status

Row = tuple[Request, Sequence]
Guessed = tuple[Request, Sequence, list[int]]  # a row and the tokens guessed after its own
NGRAM = 3  # the longest suffix of the context looked for earlier in it ...
SHORTEST = 2  # ... and the shortest (the module's docstring)


def prompt_lookup(context: list[int], tokens: int, ngram: int = NGRAM,
                  shortest: int = SHORTEST) -> list[int]:
    """Up to ``tokens`` tokens guessed to follow ``context``: those that followed the latest
    earlier occurrence of its last ``ngram`` tokens (or fewer, down to ``shortest``), copied
    on past the end of the context from the guess itself where the occurrence is that recent
    (a repeating stretch goes on repeating); none if no such suffix occurs before."""
    end = len(context)
    for n in range(min(ngram, end - 1), shortest - 1, -1):
        suffix = context[end - n:]
        last = suffix[-1]
        for start in range(end - n - 1, -1, -1):  # the latest first; a token must follow
            if context[start + n - 1] == last and context[start:start + n] == suffix:
                guess: list[int] = []
                for j in range(start + n, start + n + tokens):
                    guess.append(context[j] if j < end else guess[j - end])
                return guess
    return []


class PassCosts:
    """The seconds of a one-row pass that checks T places (T = 1: a plain step), as the engine
    times them on its CPU: the median of the last few of each; and what a guessed token costs
    its guesser (nothing to speak of for prompt lookup, a step of its own model for a draft).
    A GPU's passes are not timed (its kernels return before they run), and with no table the
    window alone decides."""

    KEEP = 8  # passes of each size (and guesses) remembered

    def __init__(self) -> None:
        self.seconds: dict[int, deque[float]] = {}
        self.guessing: deque[float] = deque(maxlen=self.KEEP)  # seconds a guessed token

    def add(self, places: int, seconds: float) -> None:
        self.seconds.setdefault(places, deque(maxlen=self.KEEP)).append(seconds)

    def add_guesses(self, tokens: int, seconds: float) -> None:
        """A guesser made ``tokens`` guesses in ``seconds``."""
        if tokens:
            self.guessing.append(seconds / tokens)

    def cost(self, places: int) -> float | None:
        times = self.seconds.get(places)
        return statistics.median(times) if times else None

    def guesses(self, k: int, acceptance: Acceptance) -> int:
        """Of 1 .. ``k`` guesses, the number whose pass is expected to make the most tokens a
        second (``acceptance.expected`` over the pass's cost and its guesses'); ``k`` itself
        until a plain step and a pass of ``k + 1`` places have been timed (so that it is)."""
        if k <= 1 or self.cost(1) is None or self.cost(k + 1) is None:
            return k
        guess = statistics.median(self.guessing) if self.guessing else 0.0
        costs = {n: self.cost(n + 1) for n in range(1, k + 1)}  # each median once
        timed = [n for n, cost in costs.items() if cost is not None]
        return max(timed, key=lambda n: acceptance.expected(n) / (costs[n] + n * guess))


def timed(costs: PassCosts | None, places: int, run: Callable[[], object]):
    """``run()``, its seconds added to ``costs`` as a pass of ``places`` (None: not timed)."""
    start = time.perf_counter()
    out = run()
    if costs is not None:
        costs.add(places, time.perf_counter() - start)
    return out


def timed_guess(costs: PassCosts | None, guesser: Callable[[Sequence, int], list[int]],
                seq: Sequence, tokens: int) -> list[int]:
    """``guesser(seq, tokens)``, its seconds a guessed token added to ``costs`` (None: not
    timed)."""
    start = time.perf_counter()
    out = guesser(seq, tokens)
    if costs is not None:
        costs.add_guesses(len(out), time.perf_counter() - start)
    return out


def lookup(seq: Sequence, tokens: int) -> list[int]:
    """A guesser: :func:`prompt_lookup` in ``seq``'s context."""
    return prompt_lookup(seq.tokens[seq.offset:], tokens)


def split(rows: list[Row], width: int, max_len: int,
          guesser: Callable[[Sequence, int], list[int]] = lookup,
          costs: PassCosts | None = None) -> tuple[list[Row], list[Guessed]]:
    """A decode step's rows: those that decode plainly, and those that feed a guess (a
    one-row request with ``Params.speculate``, whose context guesses something): as many
    tokens as it asks for, within its slot's ``width`` (the last column is the scratch's),
    the model's ``max_len`` and the tokens its request may still make, and as far as its
    guesses so far have held (``Acceptance.window``), and where ``costs`` has timed this
    machine's passes, as many as pay best (:meth:`PassCosts.guesses`); ``guesser(seq, n)``
    guesses up to n tokens (:func:`lookup`, or a draft model: draft.py)."""
    plain: list[Row] = []
    guessed: list[Guessed] = []
    for request, seq in rows:
        # (a grammar's mask follows the tokens chosen: a guess would need one per place)
        k = request.params.speculate if request.beam is None and \
            request.constraint is None else 0
        if k:
            k = min(k, request.speculation.window or k, width - 2 - seq.cached,
                    max_len - seq.context,
                    request.limit - request.generated - 1)
            if costs is not None:
                k = costs.guesses(k, request.speculation)
        guess = timed_guess(costs, guesser, seq, k) if k > 0 else []
        if guess:
            guessed.append((request, seq, guess))
        else:
            plain.append((request, seq))
    return plain, guessed


def verify(runner, sampler, rows: list[Guessed], fed: Callable[[Sequence, int], None],
           extend: Callable[[Request, Sequence, int], None], totals: Acceptance,
           costs: PassCosts | None = None) -> None:
    """One forward pass over ``rows``, each feeding its uncached token and its guess; then
    each row's tokens chosen place by place (``sampler``), moved on with ``extend`` (the
    engine's own, which ends a request at ``<eos>``, its limit or its stop), while the token
    chosen is the guess's next. ``fed`` counts the keys that hold into the row's cache; the
    guesses and how many held go to the request's ``speculation`` and to ``totals``; a
    one-row pass's seconds to ``costs``."""
    for _, seq, guess in rows:  # fed as the row's own, then taken back
        seq.tokens.extend(guess)
    try:
        places = [(r, s, 1 + len(g)) for r, s, g in rows]
        logits = timed(costs if len(rows) == 1 else None, places[0][2],
                       lambda: runner.verify(places))
    finally:
        for _, seq, guess in rows:
            del seq.tokens[len(seq.tokens) - len(guess):]
    for i, (request, seq, guess) in enumerate(rows):
        held = 0
        for j in range(len(guess) + 1):
            fed(seq, 1)  # the j-th token fed is the row's: its own, or a guess that held
            token = int(sampler.choose([(request, seq)], logits[i][j:j + 1])[0])
            extend(request, seq, token)
            if request.status is Status.FINISHED or j == len(guess) or token != guess[j]:
                break
            held += 1
        for acceptance in (request.speculation, totals):
            acceptance.add(len(guess), held)
