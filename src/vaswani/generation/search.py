"""One sentence's beam search, a step at a time (:class:`Beam`): the inference engine runs
one per beam-search request (engine/beam.py), the reference decoder one per sentence of its
batch (reference.py ``beam_search``).

A hypothesis is scored by the GNMT length-normalised log-probability (Wu et al. 2016, eq. 14):
``log P(y) / lp(y)`` with ``lp(y) = ((5 + |y|) / 6) ** alpha``, where |y| counts the generated
tokens including ``<eos>``; ``alpha = 0`` is the raw log-probability.
"""

from __future__ import annotations

from torch import Tensor


def length_penalty(length: int, alpha: float) -> float:
    """GNMT: ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


class Beam:
    """One sentence's beam search, a step at a time: its finished hypotheses, and which
    hypotheses live on. The reference beam search (reference.py) and the inference engine
    (where a sentence's live hypotheses are rows of its batch) both run it.

    ``step`` takes the live hypotheses' scores (k,) and their next-token log-probabilities
    (k, V), keeps the 2K best candidates: those ending in ``<eos>`` among the top K are
    finished (kept, GNMT-normalised), the best K others continue. A hypothesis reaching the
    sentence's limit is finished as it is. The sentence is done when its ``n_best`` best
    finished hypotheses are known: when no live hypothesis can still beat the ``n_best``-th
    best finished one (log-probabilities only fall as a hypothesis grows, and with alpha >= 0
    the best it can reach is its score now divided by lp(limit)), or when its limit is
    reached. Searching on for K finished hypotheses, as GNMT does, changes none of the
    ``n_best`` returned; with ``n_best = 1`` it decoded a seventh more rows in the demo
    translator's beam-4 search (56,640 against 49,692 for 300 test verses)."""

    def __init__(self, beam: int, limit: int, *, eos_id: int, alpha: float,
                 bounded: bool, n_best: int = 1) -> None:
        if not 1 <= n_best <= beam:
            raise ValueError(f"n_best ({n_best}) must be between 1 and the beam ({beam})")
        self.K, self.limit, self.eos_id, self.alpha, self.bounded = beam, limit, eos_id, \
            alpha, bounded
        self.n_best = n_best
        self.finished: list[tuple[float, list[int]]] = []  # (normalised score, ids)
        self.done = False

    def step(self, length: int, scores: Tensor, logp: Tensor, histories: list[list[int]]
             ) -> list[tuple[int, int, float]]:
        """length: tokens each candidate will have generated; scores (k,) float64 raw
        log-probabilities of the live hypotheses; logp (k, V); histories: their generated
        ids. Returns the hypotheses that live on as (live row, next token, raw score)."""
        candidates = (scores[:, None] + logp).view(-1)  # (k * V,)
        top_scores, top_index = candidates.topk(self.candidates(candidates.numel()))
        return self.advance(length, top_scores.tolist(), top_index.tolist(), logp.size(-1),
                            histories)

    def candidates(self, n: int) -> int:
        """How many of ``n`` candidates (live hypotheses x vocabulary) a step ranks."""
        return min(2 * self.K, n)

    def advance(self, length: int, top_scores: list[float], top_index: list[int], V: int,
                histories: list[list[int]]) -> list[tuple[int, int, float]]:
        """:meth:`step` once its best candidates are known, best first (raw scores, and
        indices ``row * V + token``): the inference engine ranks those of many sentences
        at once."""
        alive: list[tuple[int, int, float]] = []
        for rank, (s, idx) in enumerate(zip(top_scores, top_index, strict=True)):
            if s == float("-inf") or len(alive) == self.K:
                break
            row, token = idx // V, idx % V
            if token == self.eos_id or length >= self.limit:
                if rank < self.K:
                    ids = histories[row] + ([] if token == self.eos_id else [token])
                    self.finished.append((s / length_penalty(length, self.alpha), ids))
            else:
                alive.append((row, token, s))
        self.finished.sort(key=lambda h: -h[0])
        if length >= self.limit or not alive:
            self.done = True
        elif len(self.finished) >= self.n_best and self.bounded:
            bound = alive[0][2] / length_penalty(self.limit, self.alpha)
            self.done = self.finished[self.n_best - 1][0] >= bound
        return [] if self.done else alive

    def best(self, n: int) -> list[tuple[list[int], float]]:
        """The n best finished hypotheses: (ids without <eos>, normalised score), best first."""
        return [(ids, score) for score, ids in self.finished[:n]]
