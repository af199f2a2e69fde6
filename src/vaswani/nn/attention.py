"""Scaled dot-product attention and multi-head attention, written out.

Shape legend: B batch, H query heads, Hkv key/value heads, Tq query length, Tk key length,
Dh head dim, D d_model. Masks are boolean, True = may attend (see ``masks.py``).

Two interchangeable paths compute the same thing:

* ``"reference"``: :func:`scaled_dot_product_attention` below, six readable lines that also
  return the attention weights (for heatmaps);
* ``"sdpa"``: PyTorch's fused ``F.scaled_dot_product_attention`` (flash / memory-efficient
  kernels, memory linear in sequence length). Tests check the two agree.

``"auto"`` (the default) picks per call: on a CPU, for keys up to ``AUTO_REFERENCE_MAX_KEYS``
long, the reference path when the inputs are bf16 or attention dropout is active, or when the
call is a decoding step's (at most ``DECODE_QUERIES`` queries per row, at least
``DECODE_SCORES`` scores in all); SDPA otherwise. There PyTorch's CPU kernel loses to the
written-out products; past 512 keys it wins, and its memory grows linearly where the
reference path's grows quadratically (the figures: docs/performance.md, "Attention at long
sequences" and "The engine's choices for a CPU").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .dropout import dropout
from .kv_cache import AttentionCache
from .linear import Linear
from .rotary import RopeScaling, apply_rope, rope_angles

AUTO_REFERENCE_MAX_KEYS = 512
DECODE_QUERIES = 16  # queries per row of a decoding step (a beam search's grouped queries)
DECODE_SCORES = 8192  # scores (rows x heads x queries x keys) from which it pays on a CPU
BACKENDS = ("auto", "sdpa", "reference")


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                                 dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(Dh)) v, the paper's equation (1).

    q: (..., Tq, Dh); k, v: (..., Tk, Dh); mask: bool, broadcastable to (..., Tq, Tk),
    True = may attend. Returns (out (..., Tq, Dh), weights (..., Tq, Tk)).

    A query row whose keys are all masked gets zero weights and a zero output, not NaN
    (softmax over nothing is 0/0). We fill masked scores with the dtype's most negative finite
    value rather than -1e9, which overflows in fp16 and is not "minus infinity" in bf16.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:
        weights = weights * mask.any(dim=-1, keepdim=True)  # zero rows that saw no key
    weights = dropout(weights, dropout_p)
    return weights @ v, weights  # (..., Tq, Dh), (..., Tq, Tk)


def decoding_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """:func:`scaled_dot_product_attention` in fewer operations, for a decoding step's few
    queries per row over many rows, where each operation's fixed cost counts: the queries
    scaled rather than the scores (Tq x Dh numbers, not Tq x Tk), the masked scores filled
    in place, no weights kept. A query that may attend to no key gets the mean of the values
    rather than zeros (a decoding step's real queries always see their own key; the
    engine's padding rows are thrown away)."""
    scores = (q * (1.0 / math.sqrt(q.size(-1)))) @ k.transpose(-2, -1)  # (..., Tq, Tk)
    if mask is not None:
        scores.masked_fill_(mask.logical_not(), torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1) @ v


class MultiHeadAttention(nn.Module):
    """Multi-head attention for self-attention (``memory=None``) and cross-attention.

    One fused input projection ``in_proj`` holds [W_q; W_k; W_v] stacked by rows, as in
    ``torch.nn.MultiheadAttention``: self-attention does a single matmul for q, k and v;
    cross-attention projects the queries with the first rows and the memory with the rest.
    ``n_kv_heads < n_heads`` gives grouped-query attention (each k/v head serves
    ``n_heads // n_kv_heads`` query heads).
    """

    def __init__(self, d_model: int, n_heads: int, *, n_kv_heads: int | None = None,
                 dropout: float = 0.0, bias: bool = True, qkv_bias: bool | None = None,
                 backend: Literal["auto", "sdpa", "reference"] = "auto",
                 rope_base: float | None = None, rope_scaling: RopeScaling | None = None,
                 head_dim: int | None = None,
                 qk_norm: Callable[[int], nn.Module] | None = None) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads and head_dim is None:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads})")
        if backend not in BACKENDS:
            raise ValueError(f"backend ({backend!r}) must be one of {', '.join(BACKENDS)}")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads if head_dim is None else head_dim
        self.q_dim = n_heads * self.head_dim
        self.kv_dim = n_kv_heads * self.head_dim
        self.dropout = dropout
        self.backend = backend
        self.rope_base = rope_base  # rotary positions on q and k (self-attention) when set
        self.rope_scaling = rope_scaling  # Llama 3's rescaled frequencies
        # qkv_bias: biases on q, k and v only (Qwen2); None: as ``bias``
        self.in_proj = Linear(d_model, self.q_dim + 2 * self.kv_dim,
                              bias=bias if qkv_bias is None else qkv_bias)
        self.out_proj = Linear(self.q_dim, d_model, bias=bias)
        # qk_norm(width): a norm over each head's queries, another over its keys (Gemma 3)
        self.q_norm = None if qk_norm is None else qk_norm(self.head_dim)
        self.k_norm = None if qk_norm is None else qk_norm(self.head_dim)

    def _split_heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)  # (B, n, T, Dh)

    def _project(self, x: Tensor, start: int, stop: int) -> Tensor:
        """x through output rows ``start:stop`` of ``in_proj`` (cross-attention projects its
        queries and its memory apart; linear.py and quantized.py keep each part ready)."""
        return self.in_proj.rows(x, start, stop)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of a cross-attention memory: (B, Hkv, Tk, Dh) each."""
        k, v = self._project(memory, self.q_dim, self.q_dim + 2 * self.kv_dim).split(
            self.kv_dim, dim=-1)
        return self._split_heads(k, self.n_kv_heads), self._split_heads(v, self.n_kv_heads)

    def forward(self, x: Tensor, *, memory: Tensor | None = None, mask: Tensor | None = None,
                cache: AttentionCache | None = None, positions: Tensor | None = None,
                need_weights: bool = False, cross: bool | None = None
                ) -> tuple[Tensor, Tensor | None]:
        """x: (B, Tq, D); memory: (B, Tk, D) for cross-attention; mask: bool, broadcastable to
        (B, H, Tq, Tk). Returns (out (B, Tq, D), weights (B, H, Tq, Tk) or None).

        ``cross``: cross-attention (default: when there is a ``memory``). ``cache``
        (incremental decoding, an :class:`~vaswani.nn.kv_cache.AttentionCache`): in
        self-attention the new keys and values are appended to it and attention runs over
        all of them; in cross-attention the memory's keys and values are computed on the
        first call and reused afterwards (a cache that already holds them needs no memory).
        The cache runs the attention (:meth:`attend`), so that it may lay out its rows as it
        keeps them.
        ``positions`` (Tq,) or (B, Tq) are the new tokens' positions, used by rotary
        embeddings (default: after the cached tokens).
        Weights are returned only with ``need_weights=True`` (the reference path then runs,
        whatever the backend).
        """
        B, Tq, _ = x.shape
        cross = memory is not None if cross is None else cross
        if not cross:  # self-attention: one matmul for q, k and v
            q, k, v = self.in_proj(x).split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
            k, v = self._split_heads(k, self.n_kv_heads), self._split_heads(v, self.n_kv_heads)
            q = self._split_heads(q, self.n_heads)  # (B, H, Tq, Dh)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            if self.rope_base is not None:
                if positions is None:
                    past = 0 if cache is None or cache.k is None else cache.k.size(2)
                    positions = torch.arange(past, past + Tq, device=x.device)
                cos, sin = rope_angles(positions, self.head_dim, self.rope_base,
                                       self.rope_scaling)
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, Hkv, T_cached + Tq, Dh)
        else:  # cross-attention: queries from x, keys and values from memory
            q = self._split_heads(self._project(x, 0, self.q_dim), self.n_heads)
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v  # the memory does not change between steps
            elif memory is None:
                raise ValueError("cross-attention needs a memory, or a cache that holds its "
                                 "keys and values")
            else:
                k, v = self.project_kv(memory)
                if cache is not None:
                    cache.k, cache.v = k, v
        if cache is not None and not need_weights:  # the cache may attend its own way
            out, weights = cache.attend(q, k, v, mask, self._attend_only), None
        else:
            out, weights = self.attend(q, k, v, mask, need_weights)
        out = out.transpose(1, 2).reshape(B, Tq, self.q_dim)  # (B, Tq, H*Dh)
        return self.out_proj(out), weights

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """q: (B, H, Tq, Dh); k, v: (B, Hkv, Tk, Dh) -> (B, H, Tq, Dh), weights or None."""
        p = self.dropout if self.training else 0.0
        if not need_weights and self._use_sdpa(q, k, p):
            gqa = self.n_kv_heads != self.n_heads
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                 enable_gqa=gqa)
            return out, None
        if self.n_kv_heads != self.n_heads:  # repeat each k/v head for its group of q heads
            group = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(group, dim=1)  # (B, H, Tk, Dh)
            v = v.repeat_interleave(group, dim=1)
        if (not need_weights and p == 0.0 and q.size(-2) <= DECODE_QUERIES
                and not torch.is_grad_enabled()):  # inference's decoding steps
            return decoding_attention(q, k, v, mask), None
        out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p=p)
        return out, weights if need_weights else None  # never keep weights nobody asked for

    def _attend_only(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        return self.attend(q, k, v, mask)[0]

    def _use_sdpa(self, q: Tensor, k: Tensor, dropout_p: float) -> bool:
        if self.backend != "auto":
            return self.backend == "sdpa"
        if q.device.type != "cpu" or k.size(-2) > AUTO_REFERENCE_MAX_KEYS:
            return True
        decoding = (q.size(-2) <= DECODE_QUERIES
                    and q.size(0) * q.size(1) * q.size(-2) * k.size(-2) >= DECODE_SCORES)
        return not (q.dtype == torch.bfloat16 or dropout_p > 0.0 or decoding)
