"""Rules that adjust next-token scores before a token is chosen: the decoding controls.

Each rule is a pure function of the scores and of the tokens so far, so greedy search,
sampling and beam search (which reorders its hypotheses every step) all apply them the same
way, and a sentence's output does not depend on what else is in the batch:

* ``repetition_penalty`` (Keskar et al. 2019, as Hugging Face applies it): the score of a token
  that already occurs in the sequence is divided by the penalty when positive and multiplied
  by it when negative (1 = off);
* ``presence_penalty`` / ``frequency_penalty`` (OpenAI's): subtract ``presence * [count > 0] +
  frequency * count``, counting the tokens generated so far (0 = off);
* ``no_repeat_ngram_size`` n: a token that would complete an n-gram already in the sequence is
  forbidden (0 = off);
* ``min_length``: ``<eos>`` is forbidden until that many tokens have been generated (counted
  per row).

Padding never counts as an occurrence. Shapes: N rows, V vocabulary, T and G tokens so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor


@dataclass(frozen=True)
class Rules:
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    no_repeat_ngram_size: int = 0
    min_length: int = 0

    @cached_property  # read for every row of every engine step
    def active(self) -> bool:
        return self != Rules()

    @property
    def reads_sequence(self) -> bool:
        """Whether :meth:`apply` reads ``sequence`` (repetition, n-grams)."""
        return self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0

    @property
    def reads_generated(self) -> bool:
        """Whether :meth:`apply` reads ``generated`` (presence and frequency; ``min_length``
        needs only how many tokens each row has generated)."""
        return bool(self.presence_penalty or self.frequency_penalty)

    @classmethod
    def of(cls, decode) -> Rules:
        """The rules of a ``DecodeConfig``."""
        return cls(decode.repetition_penalty, decode.presence_penalty, decode.frequency_penalty,
                   decode.no_repeat_ngram_size, decode.min_length)

    def apply(self, scores: Tensor, sequence: Tensor | None, generated: Tensor | None, *,
              eos_id: int, pad_id: int, lengths: Tensor | None = None) -> Tensor:
        """scores (N, V) float; sequence (N, T): the tokens repetition looks at (a language
        model's prompt and output; a translation's output); generated (N, G): the output so
        far; lengths (N,): how many tokens each row has generated (default: ``generated``'s
        real tokens). A tensor that the active rules do not read (``reads_sequence``,
        ``reads_generated``) may be None: building it costs each step the length of every
        row so far. Returns the adjusted scores (a new tensor when anything changes)."""
        if not self.active:
            return scores
        scores = scores.clone()
        if self.repetition_penalty != 1.0 and sequence.numel():
            seen = torch.zeros_like(scores, dtype=torch.bool)
            seen.scatter_(1, sequence, sequence != pad_id)
            penalised = torch.where(scores > 0, scores / self.repetition_penalty,
                                    scores * self.repetition_penalty)
            scores = torch.where(seen, penalised, scores)
        if (self.presence_penalty or self.frequency_penalty) and generated.numel():
            counts = torch.zeros_like(scores)
            counts.scatter_add_(1, generated, (generated != pad_id).to(scores.dtype))
            scores -= self.presence_penalty * (counts > 0) + self.frequency_penalty * counts
        if self.no_repeat_ngram_size:
            banned = ngram_bans(*compact(sequence, sequence != pad_id),
                                self.no_repeat_ngram_size, scores.size(-1))
            scores = scores.masked_fill(banned, float("-inf"))
        if self.min_length and eos_id >= 0:
            if lengths is None:
                lengths = (generated != pad_id).sum(1)
            short = lengths < self.min_length  # per row
            scores[:, eos_id] = scores[:, eos_id].masked_fill(short, float("-inf"))
        return scores


def compact(sequence: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's real tokens moved to its front (padding may sit anywhere: left-padded
    prompts, finished rows): (N, T) tokens (padding after them is 0) and (N,) lengths."""
    N, T = sequence.shape
    index = torch.where(real, real.cumsum(1) - 1, T)  # padding goes to a spare column
    out = torch.zeros(N, T + 1, dtype=sequence.dtype, device=sequence.device)
    out.scatter_(1, index, sequence)
    return out[:, :T], real.sum(1)


def ngram_bans(tokens: Tensor, lengths: Tensor, n: int, vocab: int) -> Tensor:
    """(N, V) bool: the tokens that would end an n-gram already in each row, for rows of
    ``lengths`` real tokens at the front of ``tokens`` (N, T): those that followed each
    earlier occurrence of the row's last n-1 tokens (:func:`banned_by_ngrams` for one row,
    written out)."""
    N, T = tokens.shape
    banned = torch.zeros(N, vocab + 1, dtype=torch.bool, device=tokens.device)
    if n == 1:  # every token already there
        index = torch.where(torch.arange(T, device=tokens.device) < lengths[:, None], tokens,
                            vocab)
        return banned.scatter_(1, index, True)[:, :vocab]
    if T < n:
        return banned[:, :vocab]
    steps = torch.arange(n - 1, device=tokens.device)
    tail = tokens.gather(1, (lengths[:, None] - (n - 1) + steps).clamp(min=0))  # (N, n-1)
    windows = tokens.unfold(1, n, 1)  # (N, T - n + 1, n): every n-gram
    starts = torch.arange(windows.size(1), device=tokens.device)
    complete = starts[None, :] + n <= lengths[:, None]  # n-grams inside the real tokens
    match = (windows[..., : n - 1] == tail[:, None, :]).all(-1) & complete
    match &= (lengths >= n - 1)[:, None]
    index = torch.where(match, windows[..., n - 1], vocab)  # non-matches to a spare column
    return banned.scatter_(1, index, True)[:, :vocab]


def banned_by_ngrams(tokens: list[int], n: int) -> set[int]:
    """The tokens that would end an n-gram already in ``tokens``: those that followed each
    earlier occurrence of the last n-1 tokens. The readable one-row reference that
    :func:`ngram_bans` (what decoding runs, on every row at once) is tested against."""
    if len(tokens) < n - 1 or n < 1:
        return set()
    if n == 1:
        return set(tokens)
    tail = tuple(tokens[len(tokens) - n + 1:])
    return {tokens[i + n - 1] for i in range(len(tokens) - n + 1)
            if tuple(tokens[i: i + n - 1]) == tail}
