"""Attention on a CPU: which of the two paths to run, per call, and a decoding step's lean one.

PyTorch's fused attention (SDPA) loses on a CPU to the written-out products for short keys
in bf16, with dropout on the weights, and for a decoding step's few queries over many rows;
past ``REFERENCE_MAX_KEYS`` keys it wins, and its memory grows linearly where the written-out
path's grows quadratically (docs/performance.md, "Attention at long sequences" and "The
engine's choices for a CPU"); a compiled graph takes SDPA at every length, except for one
query a row (a compiled decode step: engine/compiled.py), which it computes as sums of
elementwise products (:func:`one_query_attention`). :class:`CPUAttention` makes that choice for
:class:`~vaswani.nn.attention.Attention`'s ``"auto"``, and runs a decoding step (under
inference, at most ``DECODE_QUERIES`` queries per row) through :func:`decoding_attention`.
On another device ``"auto"`` is SDPA, as in nn/.

The engine's passes (:func:`engine_pass`) choose by their kind instead: a pass's shapes are
its batch's (the longest row's tokens and keys, the number of rows), and a row's result must
not depend on what shares its batch. A prefill runs SDPA; a decoding step runs the written-out
products (:func:`decoding_attention`), whose batched products give each row the same bits
whatever the number of rows, where SDPA's kernel for one query a row does not. With key widths
in multiples of the cache's alignment (engine/runner.py), the keys padded past a row's own
change none of its bits either.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

import torch
from torch import Tensor

from ..nn import masks
from ..nn.attention import Attention, attention_weights, kv_group, repeat_kv
from .dropout import lane_dropout

REFERENCE_MAX_KEYS = 512
DECODE_QUERIES = 16  # queries per row of a decoding step (a beam search's grouped queries)
DECODE_SCORES = 8192  # scores (rows x heads x queries x keys) from which it pays on a CPU
PASS: ContextVar[str | None] = ContextVar("engine_pass", default=None)


@contextmanager
def engine_pass(kind: Literal["prefill", "decode"]) -> Iterator[None]:
    """The attention inside runs by ``kind``, whatever the shapes (see the module): an
    engine's prefill through SDPA, its decoding step through :func:`decoding_attention`."""
    token = PASS.set(kind)
    try:
        yield
    finally:
        PASS.reset(token)


def decoding_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """:func:`~vaswani.nn.attention.scaled_dot_product_attention` in fewer operations, for a
    decoding step's few queries per row over many rows, where each operation's fixed cost
    counts: the queries scaled rather than the scores (Tq x Dh numbers, not Tq x Tk), the
    masked scores filled in place, no weights kept; with grouped-query attention (``k``, ``v``
    of fewer heads than ``q``) each key/value head's queries side by side, rather than the
    keys and values copied for every query head. A query that may attend to no key gets the
    mean of the values rather than zeros (a decoding step's real queries always see their
    own key; the engine's padding rows are thrown away).

    q (B, H, Tq, Dh), k and v (B, Hkv, Tk, Dh), mask broadcast to (B, H, Tq, Tk) or None."""
    B, H, Tq, Dh = q.shape
    group = H // k.size(1)
    if group > 1 and mask is not None and mask.size(1) > 1:  # a mask per query head
        k, v, group = repeat_kv(k, group), repeat_kv(v, group), 1
    if group > 1:  # (B, Hkv, group * Tq, Dh): query head h reads key/value head h // group
        q = q.reshape(B, H // group, group * Tq, Dh)
        if mask is not None and mask.size(-2) > 1:
            mask = mask.repeat(1, 1, group, 1)  # each query row's mask, for every group
    scores = (q * (1.0 / math.sqrt(Dh))) @ k.transpose(-2, -1)  # (..., group * Tq, Tk)
    if mask is not None:
        scores.masked_fill_(mask.logical_not(), torch.finfo(scores.dtype).min)
    return (scores.softmax(dim=-1) @ v).view(B, H, Tq, Dh)


def one_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """The attention of one query a row as sums of elementwise products, not matrix products,
    for a compiled decode step: Inductor fuses the sums with how the step reads the keys and
    values (each row's slot, or its source's, gathered by index; a bfloat16 cache converted)
    into one pass over the keys and one over the values, where SDPA's kernel, a call of its
    own, needs them gathered into tensors of their own first: every key written once more
    and read again each step (docs/performance.md, "A compiled decode step"). With
    grouped-query attention each key/value head serves its ``group`` query heads as they are.
    A query that may attend to no key gets the mean of the values, as in
    :func:`decoding_attention`.

    q (B, H, 1, Dh), k and v (B, Hkv, Tk, Dh), mask broadcast to (B, H, 1, Tk) or None."""
    B, H, _, Dh = q.shape
    Hkv, Tk = k.size(1), k.size(2)
    group = H // Hkv
    q = q.reshape(B, Hkv, group, 1, Dh) * (1.0 / math.sqrt(Dh))
    scores = (q * k[:, :, None]).sum(-1)  # (B, Hkv, group, Tk)
    if mask is not None:
        allowed = mask.expand(B, H, 1, Tk).reshape(B, Hkv, group, Tk)
        scores = scores.masked_fill(allowed.logical_not(), torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    return (weights[..., None] * v[:, :, None]).sum(-2).view(B, H, 1, Dh)


class CPUAttention(Attention):
    """:class:`~vaswani.nn.attention.Attention` with a CPU's choice of path (see the module)."""

    @classmethod
    def of(cls, attention: Attention) -> CPUAttention:
        layer = cls(attention.dropout, attention.backend)
        return layer.train(attention.training)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        p = self.dropout if self.training else 0.0
        if (torch.compiler.is_compiling() and self.backend == "auto" and q.size(-2) == 1
                and p == 0.0 and not need_weights and q.device.type == "cpu"):
            return one_query_attention(q, k, v, masks.dense(mask, q.device)), None
        kind = PASS.get() if (self.backend == "auto" and not need_weights and p == 0.0
                              and q.device.type == "cpu"
                              and not torch.compiler.is_compiling()) else None
        if kind == "decode" or (kind == "prefill" and q.dtype == torch.bfloat16):
            return decoding_attention(q, k, v, masks.dense(mask, q.device)), None
        if kind == "prefill":
            return self.fused(q, k, v, mask, p), None
        if not need_weights and self.use_sdpa(q, k, p):
            return self.fused(q, k, v, mask, p), None
        mask = masks.dense(mask, q.device)  # the written-out paths take a tensor
        if (not need_weights and p == 0.0 and q.size(-2) <= DECODE_QUERIES
                and not torch.is_grad_enabled()):  # inference's decoding steps
            return decoding_attention(q, k, v, mask), None
        group = kv_group(q, k)
        k, v = repeat_kv(k, group), repeat_kv(v, group)
        weights = lane_dropout(attention_weights(q, k, mask), p)
        return weights @ v, weights if need_weights else None

    def use_sdpa(self, q: Tensor, k: Tensor, dropout_p: float) -> bool:
        if self.backend != "auto":
            return self.backend == "sdpa"
        if q.device.type != "cpu" or torch.compiler.is_compiling():
            return True  # (compiled: one graph for every length; one query: see forward)
        if k.size(-2) > REFERENCE_MAX_KEYS:
            return True
        decoding = (q.size(-2) <= DECODE_QUERIES
                    and q.size(0) * q.size(1) * q.size(-2) * k.size(-2) >= DECODE_SCORES)
        return not (q.dtype == torch.bfloat16 or dropout_p > 0.0 or decoding)
