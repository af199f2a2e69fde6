"""Encoder and decoder layers, and the stacks that hold them.

Shape legend: B batch, S source length, T target length, D d_model.

Residual wiring, two ways (``norm_first``):

* post-LN (the paper):  x = norm(x + dropout(sublayer(x)))
* pre-LN:               x = x + dropout(sublayer(norm(x)))  ... and one final norm after the
  stack, because otherwise the stack's output is an un-normalised sum of residuals.
"""

from __future__ import annotations

from torch import Tensor, nn

from .attention import MultiHeadAttention
from .dropout import Dropout
from .feedforward import FeedForward
from .kv_cache import KVCache, LayerCache
from .norm import make_norm


class _Residual(nn.Module):
    """One sublayer with its norm and dropout, wired post-LN or pre-LN."""

    def __init__(self, d_model: int, *, norm: str, eps: float, bias: bool, dropout: float,
                 norm_first: bool) -> None:
        super().__init__()
        self.norm = make_norm(norm, d_model, eps, bias)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward, each with a residual connection."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, dropout: float = 0.1,
                 attn_dropout: float | None = None, n_kv_heads: int | None = None,
                 norm_first: bool = False, norm: str = "layernorm", norm_eps: float = 1e-5,
                 activation: str = "relu", bias: bool = True, backend: str = "auto",
                 rope_base: float | None = None) -> None:
        super().__init__()
        attn_dropout = dropout if attn_dropout is None else attn_dropout
        wiring = dict(norm=norm, eps=norm_eps, bias=bias, dropout=dropout, norm_first=norm_first)
        self.self_attn = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads,
                                            dropout=attn_dropout, bias=bias, backend=backend,
                                            rope_base=rope_base)
        self.feed_forward = FeedForward(d_model, d_ff, activation=activation, dropout=dropout,
                                        bias=bias)
        self.attn_block = _Residual(d_model, **wiring)
        self.ff_block = _Residual(d_model, **wiring)
        self.last_weights: Tensor | None = None

    def forward(self, x: Tensor, *, mask: Tensor | None = None, positions: Tensor | None = None,
                need_weights: bool = False) -> Tensor:
        """x: (B, S, D); mask: bool broadcastable to (B, H, S, S). Returns (B, S, D).
        ``positions`` reach rotary embeddings (default 0 .. S-1).

        With ``need_weights`` the attention weights are kept in ``self.last_weights``.
        """
        def attend(h: Tensor) -> Tensor:
            out, self.last_weights = self.self_attn(h, mask=mask, positions=positions,
                                                    need_weights=need_weights)
            return out

        x = self.attn_block(x, attend)
        return self.ff_block(x, self.feed_forward)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder memory (omitted in a
    decoder-only model), then feed-forward; each with a residual connection."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, dropout: float = 0.1,
                 attn_dropout: float | None = None, n_kv_heads: int | None = None,
                 norm_first: bool = False, norm: str = "layernorm", norm_eps: float = 1e-5,
                 activation: str = "relu", bias: bool = True, backend: str = "auto",
                 rope_base: float | None = None, cross_attention: bool = True) -> None:
        super().__init__()
        attn_dropout = dropout if attn_dropout is None else attn_dropout
        wiring = dict(norm=norm, eps=norm_eps, bias=bias, dropout=dropout, norm_first=norm_first)
        mha = dict(n_kv_heads=n_kv_heads, dropout=attn_dropout, bias=bias, backend=backend)
        self.self_attn = MultiHeadAttention(d_model, n_heads, rope_base=rope_base, **mha)
        self.self_block = _Residual(d_model, **wiring)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, **mha) if cross_attention else None
        self.cross_block = _Residual(d_model, **wiring) if cross_attention else None
        self.feed_forward = FeedForward(d_model, d_ff, activation=activation, dropout=dropout,
                                        bias=bias)
        self.ff_block = _Residual(d_model, **wiring)
        self.last_weights: Tensor | None = None
        self.last_cross_weights: Tensor | None = None

    def forward(self, x: Tensor, *, memory: Tensor | None = None, mask: Tensor | None = None,
                memory_mask: Tensor | None = None, cache: LayerCache | None = None,
                positions: Tensor | None = None, need_weights: bool = False) -> Tensor:
        """x: (B, T, D); memory: (B, S, D); mask: causal (+ padding), broadcastable to
        (B, H, T, T_keys); memory_mask: the *source* padding mask, broadcastable to
        (B, H, T, S); cache: this layer's entry of a KVCache (incremental decoding)."""
        def self_attend(h: Tensor) -> Tensor:
            out, self.last_weights = self.self_attn(
                h, mask=mask, cache=None if cache is None else cache.self_attn,
                positions=positions, need_weights=need_weights)
            return out

        def cross_attend(h: Tensor) -> Tensor:
            out, self.last_cross_weights = self.cross_attn(
                h, memory=memory, mask=memory_mask,
                cache=None if cache is None else cache.cross_attn, need_weights=need_weights)
            return out

        x = self.self_block(x, self_attend)
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this decoder layer has cross-attention and needs memory")
            x = self.cross_block(x, cross_attend)
        return self.ff_block(x, self.feed_forward)


class Stack(nn.Module):
    """N layers applied in order, and a final norm when the layers are pre-LN."""

    def __init__(self, layers: list[nn.Module], final_norm: nn.Module | None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = final_norm

    def forward(self, x: Tensor, *, cache: KVCache | None = None, **kwargs) -> Tensor:
        for i, layer in enumerate(self.layers):
            if cache is not None:
                kwargs["cache"] = cache.layers[i]
            x = layer(x, **kwargs)
        return x if self.norm is None else self.norm(x)
