"""Next-token logits for a growing batch of sequences, with or without a KV cache.

Greedy search, beam search and sampling only need three things from a model: the logits of
the next token given the tokens so far, a way to keep some rows of the batch (beam search
reorders hypotheses), and how long each sequence may grow. A *stepper* provides them for one
model family. With ``use_cache=True`` each call feeds only the newest token and reuses the
keys and values of the earlier ones; with ``use_cache=False`` it recomputes the whole
prefix every step (the slow reference the cache is tested against).

Shape legend: N rows (sentences x beams), T tokens so far, S source length, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..models import DecoderLM, EncoderDecoder


class Seq2SeqStepper:
    """The decoder of an EncoderDecoder, conditioned on an encoded source batch."""

    def __init__(self, model: EncoderDecoder, src: Tensor, *, use_cache: bool = True) -> None:
        self.model = model
        self.src_mask = src != model.config.pad_id  # (N, S)
        self.memory = model.encode(src, src_mask=self.src_mask)  # (N, S, D)
        self.cache = model.new_cache() if use_cache else None

    def source_lengths(self) -> Tensor:
        return self.src_mask.sum(1)  # (N,)

    def logits(self, tokens: Tensor) -> Tensor:
        """tokens (N, T), all tokens so far -> next-token logits (N, V)."""
        if self.cache is None:
            return self.model.decode(tokens, self.memory, src_mask=self.src_mask)[:, -1]
        new = tokens[:, self.cache.length:]  # only what the cache has not seen
        return self.model.decode(new, self.memory, src_mask=self.src_mask,
                                 cache=self.cache)[:, -1]

    def reorder(self, rows: Tensor) -> None:
        """Keep rows ``rows`` (N_new,) of the batch, in that order."""
        self.memory = self.memory.index_select(0, rows)
        self.src_mask = self.src_mask.index_select(0, rows)
        if self.cache is not None:
            self.cache.reorder(rows)


class LMStepper:
    """A DecoderLM continuing its prompt(s). Past ``max_len`` tokens the context is cropped to
    the last half window (positions restart), as a model trained on windows expects.

    ``pads`` (N,): prompts of different lengths batched together, each left-padded with that
    many pad tokens: a row's positions start at its first real token and padded keys are
    masked, so each row computes what it would alone (no sliding window then: the caller
    keeps prompt + new tokens within ``max_len``)."""

    def __init__(self, model: DecoderLM, *, use_cache: bool = True,
                 pads: Tensor | None = None) -> None:
        self.model = model
        self.cache = model.new_cache() if use_cache else None
        self.offset = 0  # tokens cropped from the front of the context
        self.pads = pads

    def logits(self, tokens: Tensor) -> Tensor:
        """tokens (N, T) -> next-token logits (N, V)."""
        if self.pads is not None:
            return self._padded_logits(tokens)
        max_len = self.model.config.max_len
        if tokens.size(1) - self.offset > max_len:  # slide the window
            self.offset = tokens.size(1) - max(1, max_len // 2)
            if self.cache is not None:
                self.cache = self.model.new_cache()
        context = tokens[:, self.offset:]
        if self.cache is None:
            return self.model(context, mask=torch.ones_like(context, dtype=torch.bool))[:, -1]
        new = context[:, self.cache.length:]
        return self.model(new, cache=self.cache)[:, -1]

    def _padded_logits(self, tokens: Tensor) -> Tensor:
        T = tokens.size(1)
        if T > self.model.config.max_len:
            raise ValueError(f"a batched prompt and its continuation ({T} tokens) must fit in "
                             f"max_len ({self.model.config.max_len})")
        start = 0 if self.cache is None else self.cache.length
        index = torch.arange(T, device=tokens.device)
        keep = index[None, :] >= self.pads[:, None]  # (N, T): real tokens, cached and new
        positions = (index[None, start:] - self.pads[:, None]).clamp(min=0)  # (N, T - start)
        return self.model(tokens[:, start:], mask=keep, positions=positions,
                          cache=self.cache)[:, -1]

    def reorder(self, rows: Tensor) -> None:
        if self.cache is not None:
            self.cache.reorder(rows)
        if self.pads is not None:
            self.pads = self.pads.index_select(0, rows)
