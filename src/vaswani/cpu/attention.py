"""Attention on a CPU: which of the two paths to run, per call, and a decoding step's lean one.

PyTorch's fused attention (SDPA) loses on a CPU to the written-out products for short keys
in bf16, with dropout on the weights, and for a decoding step's few queries over many rows;
past ``REFERENCE_MAX_KEYS`` keys it wins, and its memory grows linearly where the written-out
path's grows quadratically (docs/performance.md, "Attention at long sequences" and "The
engine's choices for a CPU"); a compiled step (engine/compiled.py) takes SDPA at every
length. :class:`CPUAttention` makes that choice for
:class:`~vaswani.nn.attention.Attention`'s ``"auto"``, and runs a decoding step (under
inference, at most ``DECODE_QUERIES`` queries per row) through :func:`decoding_attention`.
On another device ``"auto"`` is SDPA, as in nn/.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..nn import masks
from ..nn.attention import Attention, attention_weights, repeat_kv
from .dropout import lane_dropout

REFERENCE_MAX_KEYS = 512
DECODE_QUERIES = 16  # queries per row of a decoding step (a beam search's grouped queries)
DECODE_SCORES = 8192  # scores (rows x heads x queries x keys) from which it pays on a CPU


def decoding_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """:func:`~vaswani.nn.attention.scaled_dot_product_attention` in fewer operations, for a
    decoding step's few queries per row over many rows, where each operation's fixed cost
    counts: the queries scaled rather than the scores (Tq x Dh numbers, not Tq x Tk), the
    masked scores filled in place, no weights kept. A query that may attend to no key gets
    the mean of the values rather than zeros (a decoding step's real queries always see their
    own key; the engine's padding rows are thrown away)."""
    scores = (q * (1.0 / math.sqrt(q.size(-1)))) @ k.transpose(-2, -1)  # (..., Tq, Tk)
    if mask is not None:
        scores.masked_fill_(mask.logical_not(), torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1) @ v


class CPUAttention(Attention):
    """:class:`~vaswani.nn.attention.Attention` with a CPU's choice of path (see the module)."""

    @classmethod
    def of(cls, attention: Attention) -> CPUAttention:
        layer = cls(attention.n_heads, attention.n_kv_heads, attention.dropout, attention.backend)
        return layer.train(attention.training)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        p = self.dropout if self.training else 0.0
        if not need_weights and self.use_sdpa(q, k, p):
            return self.fused(q, k, v, mask, p), None
        k, v = repeat_kv(k, self.group), repeat_kv(v, self.group)
        mask = masks.dense(mask, q.device)  # the written-out paths take a tensor
        if (not need_weights and p == 0.0 and q.size(-2) <= DECODE_QUERIES
                and not torch.is_grad_enabled()):  # inference's decoding steps
            return decoding_attention(q, k, v, mask), None
        weights = lane_dropout(attention_weights(q, k, mask), p)
        return weights @ v, weights if need_weights else None

    def use_sdpa(self, q: Tensor, k: Tensor, dropout_p: float) -> bool:
        if self.backend != "auto":
            return self.backend == "sdpa"
        if q.device.type != "cpu" or torch.compiler.is_compiling():
            return True  # (compiled: one graph for every length, and Inductor's own kernel)
        if k.size(-2) > REFERENCE_MAX_KEYS:
            return True
        decoding = (q.size(-2) <= DECODE_QUERIES
                    and q.size(0) * q.size(1) * q.size(-2) * k.size(-2) >= DECODE_SCORES)
        return not (q.dtype == torch.bfloat16 or dropout_p > 0.0 or decoding)
