"""Scaled dot-product attention and multi-head attention, written out.

Shape legend: B batch, H query heads, Hkv key/value heads, Tq query length, Tk key length,
Dh head dim, D d_model. Masks are boolean, True = may attend (see ``masks.py``).

Two interchangeable paths compute the same thing (:class:`Attention`'s ``backend``):

* ``"reference"``: :func:`scaled_dot_product_attention` below, six readable lines that also
  return the attention weights (for heatmaps);
* ``"sdpa"``: PyTorch's fused ``F.scaled_dot_product_attention`` (flash / memory-efficient
  kernels, memory linear in sequence length). Tests check the two agree.

``"auto"`` (the default) is SDPA unless the weights are asked for. On a CPU a built model
chooses per call instead (vaswani.cpu.attention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import masks
from .dropout import check_probability, dropout
from .kv_cache import AttentionCache
from .linear import Linear
from .rotary import Rotary
from .window import window_mask

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
    weights = dropout(attention_weights(q, k, mask), dropout_p)
    return weights @ v, weights  # (..., Tq, Dh), (..., Tq, Tk)


def attention_weights(q: Tensor, k: Tensor, mask: masks.Mask | None = None) -> Tensor:
    """softmax(q k^T / sqrt(Dh)): (..., Tq, Tk), each query's weights over the keys."""
    mask = masks.dense(mask, q.device)  # a causal description (masks.causal) built
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:
        weights = weights * mask.any(dim=-1, keepdim=True)  # zero rows that saw no key
    return weights


def kv_group(q: Tensor, k: Tensor) -> int:
    """Query heads per key/value head, from q (B, H, ...) and k (B, Hkv, ...): 1 but in
    grouped-query attention. An int even where an exporter's tracer makes sizes tensors (a
    model's head counts are fixed)."""
    return int(q.size(1)) // int(k.size(1))


def repeat_kv(x: Tensor, group: int) -> Tensor:
    """Grouped-query attention's keys or values (B, Hkv, Tk, Dh) with each head repeated for
    its ``group`` query heads: (B, Hkv * group, Tk, Dh)."""
    return x if group == 1 else x.repeat_interleave(group, dim=1)


class Attention(nn.Module):
    """The attention of :class:`MultiHeadAttention` over its heads: q (B, H, Tq, Dh) and
    k, v (B, Hkv, Tk, Dh) -> (B, H, Tq, Dh), and the weights (B, H, Tq, Tk) when asked for.
    With fewer key/value heads than query heads (grouped-query attention) each serves
    H / Hkv query heads, read from the shapes. It holds no parameters; dropout on the weights
    while training."""

    def __init__(self, dropout: float = 0.0,
                 backend: Literal["auto", "sdpa", "reference"] = "auto") -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend ({backend!r}) must be one of {', '.join(BACKENDS)}")
        check_probability(dropout)
        self.dropout = dropout
        self.backend = backend

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        p = self.dropout if self.training else 0.0
        if not need_weights and self.backend != "reference":
            return self.fused(q, k, v, mask, p), None
        group = kv_group(q, k)
        out, weights = scaled_dot_product_attention(q, repeat_kv(k, group), repeat_kv(v, group),
                                                    mask, p)
        return out, weights if need_weights else None  # never keep weights nobody asked for

    def fused(self, q: Tensor, k: Tensor, v: Tensor, mask: masks.Mask | None, p: float
              ) -> Tensor:
        """PyTorch's fused kernel. A :class:`~vaswani.nn.masks.Causal` mask runs as its
        ``is_causal``, where the queries are the keys' positions (SDPA aligns ``is_causal``
        top-left: wrong when Tq != Tk, as with a cache)."""
        causal = isinstance(mask, masks.Causal) and mask.q_len == mask.k_len
        mask = None if causal else masks.dense(mask, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                              is_causal=causal, enable_gqa=kv_group(q, k) > 1)

    def extra_repr(self) -> str:
        return f"backend={self.backend!r}, dropout={self.dropout}"


@dataclass(frozen=True)
class Heads:
    """How multi-head attention splits its ``d_model`` inputs: ``n_heads`` query heads of
    ``head_dim`` numbers each (the paper: d_model / n_heads), and ``n_kv_heads`` key/value
    heads (the paper: as many; fewer is grouped-query attention, Ainslie et al. 2023, each
    key/value head serving n_heads / n_kv_heads query heads)."""

    d_model: int
    n_heads: int
    n_kv_heads: int | None = None  # None: n_heads
    head_dim: int | None = None  # None: d_model / n_heads

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads and self.head_dim is None:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads "
                             f"({self.n_heads})")
        kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        if self.n_heads % kv:
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({kv})")
        object.__setattr__(self, "n_kv_heads", kv)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)

    @property
    def q_dim(self) -> int:
        """The queries' width, n_heads x head_dim (d_model in the paper)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """The keys' width, and the values': n_kv_heads x head_dim."""
        return self.n_kv_heads * self.head_dim


class MultiHeadAttention(nn.Module):
    """Multi-head attention for self-attention (``memory=None``) and cross-attention.

    One fused input projection ``in_proj`` holds [W_q; W_k; W_v] stacked by rows, as in
    ``torch.nn.MultiheadAttention``: self-attention does a single matmul for q, k and v;
    cross-attention projects the queries with the first rows and the memory with the rest.

    The paper's module is ``MultiHeadAttention(Heads(d_model, n_heads), Attention(dropout))``.
    Later models hand it more parts, each used in self-attention only:

    * ``bias``: biases on both projections (the paper), on neither (False), or a pair
      (in_proj's, out_proj's): Qwen2 has biases on q, k and v alone, ``(True, False)``;
    * ``rotary``: a :class:`~vaswani.nn.rotary.Rotary` that turns q and k by their positions;
    * ``qk_norms``: a norm over each head's queries and another over its keys, applied before
      the rotation (Gemma 3, Qwen3);
    * ``window``: each query sees the last ``window`` tokens only (local attention,
      :mod:`vaswani.nn.window`); 0 = all of them.
    """

    def __init__(self, heads: Heads, attention: Attention | None = None, *,
                 bias: bool | tuple[bool, bool] = True, rotary: Rotary | None = None,
                 qk_norms: tuple[nn.Module, nn.Module] | None = None, window: int = 0) -> None:
        super().__init__()
        self.heads = heads
        self.attention = Attention() if attention is None else attention
        in_bias, out_bias = (bias, bias) if isinstance(bias, bool) else bias
        self.in_proj = Linear(heads.d_model, heads.q_dim + 2 * heads.kv_dim, bias=in_bias)
        self.out_proj = Linear(heads.q_dim, heads.d_model, bias=out_bias)
        self.q_norm, self.k_norm = (None, None) if qk_norms is None else qk_norms
        self.rotary = rotary
        self.window = window

    def _split_heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.heads.head_dim).transpose(1, 2)  # (B, n, T, Dh)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of a cross-attention memory: (B, Hkv, Tk, Dh) each. Only
        ``in_proj``'s k and v rows are multiplied (linear.py and quantized.py keep each part
        ready)."""
        h = self.heads
        k, v = self.in_proj.rows(memory, h.q_dim, h.q_dim + 2 * h.kv_dim).split(h.kv_dim, -1)
        return self._split_heads(k, h.n_kv_heads), self._split_heads(v, h.n_kv_heads)

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
        The cache runs the attention (its ``attend``), so that it may lay out its rows as it
        keeps them.
        ``positions`` (Tq,) or (B, Tq) are the new tokens' positions, used by the rotation
        and the window (default: after the cached tokens; keys are at positions 0 .. Tk-1).
        Weights are returned only with ``need_weights=True`` (the reference path then runs,
        whatever the backend).
        """
        B, Tq, _ = x.shape
        h = self.heads
        cross = memory is not None if cross is None else cross
        if not cross:  # self-attention: one matmul for q, k and v
            q, k, v = self.in_proj(x).split([h.q_dim, h.kv_dim, h.kv_dim], dim=-1)
            q = self._split_heads(q, h.n_heads)  # (B, H, Tq, Dh)
            k, v = self._split_heads(k, h.n_kv_heads), self._split_heads(v, h.n_kv_heads)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            if positions is None and (self.rotary is not None or self.window):
                past = 0 if cache is None or cache.k is None else cache.k.size(2)
                positions = torch.arange(past, past + Tq, device=x.device)
            if self.rotary is not None:
                q, k = self.rotary(q, k, positions)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, Hkv, T_cached + Tq, Dh)
            if self.window:  # local attention: the last ``window`` keys of each query only
                mask = masks.combine(mask, window_mask(positions, k.size(2), self.window))
        else:  # cross-attention: queries from x, keys and values from memory
            q = self._split_heads(self.in_proj.rows(x, 0, h.q_dim), h.n_heads)
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
            out, weights = cache.attend(q, k, v, mask, self._attend), None
        else:
            out, weights = self.attention(q, k, v, mask, need_weights)
        out = out.transpose(1, 2).reshape(B, Tq, h.q_dim)  # (B, Tq, H*Dh)
        return self.out_proj(out), weights

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        return self.attention(q, k, v, mask)[0]

    def extra_repr(self) -> str:
        return f"{self.heads}" + (f", window={self.window}" if self.window else "")
