"""Encoder and decoder layers, and the stack that holds them.

Shape legend: B batch, S source length, T target length, D d_model, H heads.

A layer is two or three residual blocks, each wired one of two ways (``norm_first``):

* post-LN (the paper):  x = norm(x + dropout(sublayer(x)))
* pre-LN:               x = x + dropout(sublayer(norm(x)))  ... and one final norm after the
  stack, because otherwise the stack's output is an un-normalised sum of residuals.

An encoder layer has the same parts as a decoder layer without cross-attention (which is what
a decoder-only language model uses): what makes it "encode" is the mask it is given (padding
only, no causal triangle). It stays a class of its own so that its parameters keep the names
and order that saved runs (and their optimizer states) have.

Layers return ``(x, weights)``: ``weights`` holds each attention's (B, H, Tq, Tk) weights when
asked for with ``need_weights=True`` (for heatmaps), else ``None``. Nothing is kept on the
modules.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import MultiHeadAttention
from .dropout import Dropout
from .feedforward import FeedForward
from .kv_cache import KVCache, LayerCache
from .norm import make_norm
from .rotary import RopeScaling


@dataclass(frozen=True)
class LayerOptions:
    """What every layer of a stack shares. Plain values: a model builds one from its
    ``ModelConfig`` (models/common.py). The defaults are the paper's base model."""

    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_kv_heads: int | None = None  # grouped-query attention; None = n_heads
    dropout: float = 0.1  # on every sublayer's output, and inside the feed-forward block
    attn_dropout: float | None = None  # on the attention weights; None = dropout
    norm_first: bool = False  # False: post-LN (the paper); True: pre-LN
    norm: str = "layernorm"  # or "rmsnorm"
    norm_eps: float = 1e-5
    activation: str = "relu"  # "gelu", or gated "swiglu"
    bias: bool = True  # biases in every Linear and LayerNorm
    qkv_bias: bool | None = None  # biases on the q, k, v projections; None = bias
    attention: str = "auto"  # backend: "auto", "sdpa" or "reference"
    rope_base: float | None = None  # rotary positions in self-attention when set
    rope_scaling: RopeScaling | None = None  # Llama 3's rescaled rotary frequencies
    head_dim: int | None = None  # each head's width; None = d_model / n_heads
    qk_norm: bool = False  # a norm over each head's queries and keys (Gemma 3)
    post_norms: bool = False  # pre-LN with a norm on each sublayer's output too (Gemma)
    window: int = 0  # self-attention over the last this-many tokens only (local); 0 = all


def _feed_forward(o: LayerOptions) -> FeedForward:
    return FeedForward(o.d_model, o.d_ff, activation=o.activation, dropout=o.dropout,
                       bias=o.bias)


def _attention(o: LayerOptions, *, rotary: bool) -> MultiHeadAttention:
    """The multi-head attention of a layer (rotary positions and a window act in
    self-attention only)."""
    attn_dropout = o.dropout if o.attn_dropout is None else o.attn_dropout
    qk_norm = functools.partial(make_norm, o.norm, eps=o.norm_eps, bias=o.bias) \
        if o.qk_norm else None
    return MultiHeadAttention(o.d_model, o.n_heads, n_kv_heads=o.n_kv_heads,
                              dropout=attn_dropout, bias=o.bias, qkv_bias=o.qkv_bias,
                              backend=o.attention, rope_base=o.rope_base if rotary else None,
                              rope_scaling=o.rope_scaling if rotary else None,
                              head_dim=o.head_dim, qk_norm=qk_norm,
                              window=o.window if rotary else 0)


class LayerWeights(NamedTuple):
    """One layer's attention weights, each (B, H, Tq, Tk); ``cross_attn`` is None without
    cross-attention."""

    self_attn: Tensor
    cross_attn: Tensor | None


class Residual(nn.Module):
    """One sublayer's residual connection with its norm and dropout, post-LN or pre-LN; with
    ``post_norms`` (Gemma's "sandwich"), pre-LN with a second norm on the sublayer's output:
    x = x + dropout(out_norm(sublayer(norm(x))))."""

    def __init__(self, o: LayerOptions) -> None:
        super().__init__()
        self.norm = make_norm(o.norm, o.d_model, o.norm_eps, o.bias)
        self.out_norm = make_norm(o.norm, o.d_model, o.norm_eps, o.bias) \
            if o.post_norms else None
        self.dropout = Dropout(o.dropout)
        self.norm_first = o.norm_first

    def forward(self, x: Tensor, sublayer: nn.Module, **kwargs) -> tuple[Tensor, Tensor | None]:
        """``sublayer`` reads x (normalised first when pre-LN) with ``kwargs``; returns the new
        x and what else the sublayer returned (attention weights), or None."""
        out = sublayer(self.norm(x) if self.norm_first else x, **kwargs)
        out, extra = out if isinstance(out, tuple) else (out, None)
        if self.out_norm is not None:
            out = self.out_norm(out)
        x = x + self.dropout(out)
        return (x if self.norm_first else self.norm(x)), extra


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward: two residual blocks."""

    def __init__(self, options: LayerOptions) -> None:
        super().__init__()
        o = options
        self.self_attn = _attention(o, rotary=True)
        self.feed_forward = _feed_forward(o)
        self.attn_block = Residual(o)
        self.ff_block = Residual(o)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, cache: LayerCache | None = None,
                positions: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, LayerWeights | None]:
        """x: (B, S, D) -> (B, S, D), and the attention weights when ``need_weights``.

        mask: broadcastable to (B, H, S, S), usually the source padding (B, 1, 1, S);
        positions: for rotary embeddings (default 0 .. S-1). The arguments are those of
        :meth:`DecoderLayer.forward` so that a :class:`Stack` calls every layer alike; an
        encoder layer attends to no memory.
        """
        if memory is not None:
            raise ValueError("an encoder layer has no cross-attention; memory must be None")
        x, weights = self.attn_block(x, self.self_attn, mask=mask, positions=positions,
                                     cache=None if cache is None else cache.self_attn,
                                     need_weights=need_weights)
        x, _ = self.ff_block(x, self.feed_forward)
        return x, LayerWeights(weights, None) if need_weights else None


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder's output (the "memory"), then
    feed-forward: three residual blocks. ``cross_attention=False`` leaves the middle one out
    (a decoder-only language model's layer)."""

    def __init__(self, options: LayerOptions, *, cross_attention: bool = True) -> None:
        super().__init__()
        o = options
        self.self_attn = _attention(o, rotary=True)
        self.self_block = Residual(o)
        self.cross_attn = _attention(o, rotary=False) if cross_attention else None
        self.cross_block = Residual(o) if cross_attention else None
        self.feed_forward = _feed_forward(o)
        self.ff_block = Residual(o)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, cache: LayerCache | None = None,
                positions: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, LayerWeights | None]:
        """x: (B, T, D) -> (B, T, D), and the attention weights when ``need_weights``.

        mask: broadcastable to (B, H, T, T_keys) (causal and/or padding); memory: (B, S, D)
        (None when the cache already holds the memory's keys and values); memory_mask: the
        *source* padding mask, broadcastable to (B, H, T, S); cache: this layer's entry of a
        KVCache (incremental decoding); positions: the tokens' positions for rotary
        embeddings (default: after the cached tokens).
        """
        self_cache, cross_cache = (None, None) if cache is None else cache
        x, self_w = self.self_block(x, self.self_attn, mask=mask, cache=self_cache,
                                    positions=positions, need_weights=need_weights)
        cross_w = None
        if self.cross_attn is not None:
            x, cross_w = self.cross_block(x, self.cross_attn, memory=memory, mask=memory_mask,
                                          cache=cross_cache, need_weights=need_weights,
                                          cross=True)
        x, _ = self.ff_block(x, self.feed_forward)
        return x, LayerWeights(self_w, cross_w) if need_weights else None


class Stack(nn.Module):
    """N layers applied in order, and a final norm when the layers are pre-LN."""

    def __init__(self, layers: list[nn.Module], final_norm: nn.Module | None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = final_norm
        # training: keep only each layer's input, recompute the rest in the backward pass
        # (torch.utils.checkpoint; the random state is replayed, so dropout masks agree)
        self.checkpoint_activations = False

    def forward(self, x: Tensor, *, mask: Tensor | None = None, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, cache: KVCache | None = None,
                positions: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, list[LayerWeights] | None]:
        """x: (B, T, D) -> (B, T, D), and each layer's attention weights when asked for.
        The arguments are those of :meth:`DecoderLayer.forward`; ``cache`` holds an entry
        per layer."""
        weights = []
        recompute = self.checkpoint_activations and self.training and torch.is_grad_enabled()
        for i, layer in enumerate(self.layers):
            kwargs = dict(mask=mask, memory=memory, memory_mask=memory_mask,
                          cache=None if cache is None else cache.layers[i],
                          positions=positions, need_weights=need_weights)
            if recompute:
                x, w = checkpoint(layer, x, use_reentrant=False, **kwargs)
            else:
                x, w = layer(x, **kwargs)
            weights.append(w)
        x = x if self.norm is None else self.norm(x)
        return x, weights if need_weights else None
