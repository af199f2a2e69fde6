"""Encoder and decoder layers, and the stack that holds them.

Shape legend: B batch, S source length, T target length, D d_model, H heads.

A layer is two or three residual blocks, each wired one of two ways (``norm_first``):

* post-LN (the paper):  x = norm(x + dropout(sublayer(x)))
* pre-LN:               x = x + dropout(sublayer(norm(x)))  ... and one final norm after the
  stack, because otherwise the stack's output is an un-normalised sum of residuals.

Layers take ready-made parts: their attention and feed-forward modules, and ``residual``, a
function that makes one residual block (its own norm) for each sublayer. The paper's encoder
layer (d_model 512, 8 heads):

    EncoderLayer(MultiHeadAttention(Heads(512, 8), Attention(0.1)),
                 FeedForward(512, 2048, dropout=0.1), lambda: Residual(LayerNorm(512), 0.1))

An encoder layer has the same parts as a decoder layer without cross-attention (which is what
a decoder-only language model uses): what makes it "encode" is the mask it is given (padding
only, no causal triangle). It stays a class of its own so that its parameters keep the names
and order that saved runs (and their optimizer states) have.

Layers return ``(x, weights)``: ``weights`` holds each attention's (B, H, Tq, Tk) weights when
asked for with ``need_weights=True`` (for heatmaps), else ``None``. Nothing is kept on the
modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import MultiHeadAttention
from .dropout import Dropout
from .feedforward import FeedForward
from .kv_cache import KVCache, LayerCache
from .moe import MixtureOfExperts


class LayerWeights(NamedTuple):
    """One layer's attention weights, each (B, H, Tq, Tk); ``cross_attn`` is None without
    cross-attention."""

    self_attn: Tensor
    cross_attn: Tensor | None


class Residual(nn.Module):
    """One sublayer's residual connection with its norm and dropout (see the module):
    post-LN ``x = norm(x + dropout(sublayer(x)))`` or, with ``norm_first``, pre-LN
    ``x = x + dropout(sublayer(norm(x)))``."""

    def __init__(self, norm: nn.Module, dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        self.norm = norm
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer: nn.Module, **kwargs) -> tuple[Tensor, Tensor | None]:
        """``sublayer`` reads x (normalised first when pre-LN) with ``kwargs``; returns the new
        x and what else the sublayer returned (attention weights), or None."""
        out, extra = outputs(sublayer(self.norm(x) if self.norm_first else x, **kwargs))
        x = x + self.dropout(out)
        return (x if self.norm_first else self.norm(x)), extra


def outputs(out: Tensor | tuple[Tensor, Tensor | None]) -> tuple[Tensor, Tensor | None]:
    """A sublayer's output and its attention weights (None for a feed-forward block)."""
    return out if isinstance(out, tuple) else (out, None)


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward: two residual blocks, each made by ``residual``."""

    def __init__(self, self_attn: MultiHeadAttention, feed_forward: FeedForward,
                 residual: Callable[[], Residual]) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.attn_block = residual()
        self.ff_block = residual()

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
    feed-forward: three residual blocks, each made by ``residual``. Without ``cross_attn``
    the middle one is left out (a decoder-only language model's layer)."""

    def __init__(self, self_attn: MultiHeadAttention, feed_forward: FeedForward,
                 residual: Callable[[], Residual],
                 cross_attn: MultiHeadAttention | None = None) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.self_block = residual()
        self.cross_attn = cross_attn
        self.cross_block = None if cross_attn is None else residual()
        self.feed_forward = feed_forward
        self.ff_block = residual()

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
                x, w = recomputed(layer, x, kwargs)
            else:
                x, w = layer(x, **kwargs)
            weights.append(w)
        x = x if self.norm is None else self.norm(x)
        return x, weights if need_weights else None


def recomputed(layer: nn.Module, x: Tensor, kwargs: dict) -> tuple:
    """``layer(x, **kwargs)`` keeping only its inputs, the rest computed again in the backward
    pass (torch.utils.checkpoint's reentrant form: the forward runs without autograd, so it
    leaves no graph of small records between the layer's large temporaries, which would keep
    the freed blocks from being reused and grow the heap by a layer's temporaries at each
    layer: tests/nn/test_layers.py). That form finds the layer's parameters through an
    input that needs a gradient, so a frozen embedding's output is made to need one. A
    mixture of experts keeps its router scores from the forward pass for the training
    loss, which needs autograd there: its layers take the non-reentrant form."""
    if any(isinstance(m, MixtureOfExperts) for m in layer.modules()):
        return checkpoint(layer, x, use_reentrant=False, **kwargs)
    names = list(kwargs)

    def run(x: Tensor, *values):
        return layer(x, **dict(zip(names, values, strict=True)))

    if not x.requires_grad:
        x = x.detach().requires_grad_()
    return checkpoint(run, x, *kwargs.values(), use_reentrant=True)
