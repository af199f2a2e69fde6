"""Guesses from a draft model: a smaller language model of the same vocabulary decodes a few
tokens greedily after a row's context, and those are the guess that speculate.py checks.

The draft model keeps a key/value cache per row (nn/kv_cache.py's ``KVCache``, one row,
eager): each guess feeds it what the row's context added since the last (the tokens that
held and the one chosen after them), after taking back the keys of the guesses that did not
hold. It decodes greedily, so a guess is one sequence the draft is sure of, and the check
stays exact for sampling too (speculate.py). Whatever the draft guesses, the output is the
target model's: a poor draft costs time, never a token.

Shapes: T new tokens of one row, V vocabulary.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from ..nn.kv_cache import KVCache
from .request import Sequence


@dataclass
class _Row:
    cache: KVCache
    tokens: list[int] = field(default_factory=list)  # the tokens whose keys it holds


class DraftModel:
    """``draft(seq, n)``: up to ``n`` tokens the draft model ``model`` decodes greedily after
    ``seq``'s context (fewer within its ``max_len``); a guesser for speculate.py ``split``."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.max_len = model.config.max_len
        self.device = next(model.parameters()).device
        self.rows: weakref.WeakKeyDictionary[Sequence, _Row] = weakref.WeakKeyDictionary()

    @torch.inference_mode()
    def __call__(self, seq: Sequence, tokens: int) -> list[int]:
        context = seq.tokens[seq.offset:]
        tokens = min(tokens, self.max_len - len(context))
        if tokens <= 0:
            return []
        row = self.rows.get(seq)
        if row is None:
            row = self.rows[seq] = _Row(self.model.new_cache())
        held = _common(row.tokens, context)
        held = min(held, len(context) - 1)  # at least one token fed, for its logits
        row.cache.keep(held)
        row.tokens = row.tokens[:held]
        new = context[held:]
        guess: list[int] = []
        while len(guess) < tokens:
            ids = torch.tensor([new], device=self.device)
            positions, mask = row.cache.inputs(ids)
            logits = self.model.decode_step(ids, positions=positions, mask=mask,
                                            cache=row.cache,
                                            last=torch.tensor([len(new) - 1],
                                                              device=self.device))
            row.tokens += new
            new = [int(logits[0].argmax())]
            guess += new
        return guess


def _common(a: list[int], b: list[int]) -> int:
    """The length of ``a`` and ``b``'s common beginning."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
