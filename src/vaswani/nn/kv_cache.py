"""Key/value cache for incremental decoding.

Decoding one token at a time would recompute the keys and values of every earlier token at
every step. The cache keeps them: each decoder layer appends the new token's keys and values
to its self-attention entry, and computes the cross-attention keys and values of the encoder
memory once, on the first step.

The caller owns the cache: it creates one per generation (``KVCache(n_layers)``), passes it to
the model's ``decode_step`` with the new tokens' positions and mask (:meth:`KVCache.inputs`),
and reorders it when beam search reorders hypotheses. Layers only write into the entry they
are handed; nothing is stored on the modules.

Shapes: keys and values are (B, Hkv, T, Dh); ``length`` is T of the self-attention entries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from . import masks

Attend = Callable[[Tensor, Tensor, Tensor, "Tensor | None"], Tensor]  # q, k, v, mask -> out


class AttentionCache(Protocol):
    """What an attention layer asks of its cache while decoding incrementally.

    ``k`` and ``v``: the cached keys and values (B, Hkv, Tk, Dh), None until there are some
    (a cross-attention sets them to its memory's on the first step). ``append`` adds a
    step's new keys and values and returns all of them. ``attend(q, k, v, mask, attend)``
    gives the attention's output (B, H, Tq, Dh) computed with ``attend``: :class:`KV` just
    calls it; a cache that holds the rows of many generations may lay them out its own way
    first."""

    k: Tensor | None
    v: Tensor | None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               attend: Attend) -> Tensor: ...


@dataclass
class KV:
    """One attention's cached keys and values (None until the first step): an
    :class:`AttentionCache`."""

    k: Tensor | None = None
    v: Tensor | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new keys/values along the time axis; return the full (cached + new) ones."""
        if self.k is not None:
            k = torch.cat([self.k, k], dim=2)  # (B, Hkv, T_cached + T_new, Dh)
            v = torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               attend: Attend) -> Tensor:
        return attend(q, k, v, mask)


class LayerCache(NamedTuple):
    """One decoder layer's caches: its self-attention and its cross-attention."""

    self_attn: KV
    cross_attn: KV


class KVCache:
    """Per-layer caches for a decoder stack."""

    def __init__(self, n_layers: int) -> None:
        self.layers = [LayerCache(KV(), KV()) for _ in range(n_layers)]

    @property
    def length(self) -> int:
        """Number of tokens whose keys and values are cached."""
        k = self.layers[0].self_attn.k
        return 0 if k is None else k.size(2)

    def inputs(self, ids: Tensor) -> tuple[Tensor, Tensor | None]:
        """The positions (B, T) of new tokens ``ids`` (B, T) after the cached ones, and their
        self-attention mask over cached + new keys: causal, aligned at the bottom-right
        corner (:func:`~vaswani.nn.masks.causal_mask`); None for one new token, which may
        see every key."""
        B, T = ids.shape
        past = self.length
        positions = torch.arange(past, past + T, device=ids.device).expand(B, T)
        return positions, None if T == 1 else masks.causal_mask(T, past + T, device=ids.device)

    def keep(self, n: int) -> None:
        """Keep the first ``n`` tokens' keys and values of every self-attention entry, e.g.
        a draft model's, past the guesses that did not hold (speculative decoding)."""
        for layer in self.layers:
            kv = layer.self_attn
            if kv.k is not None:
                kv.k, kv.v = kv.k[:, :, :n], kv.v[:, :, :n]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B_new,) of every entry, e.g. the surviving beams."""
        for layer in self.layers:
            for kv in (layer.self_attn, layer.cross_attn):
                if kv.k is not None:
                    kv.k = kv.k.index_select(0, index)
                    kv.v = kv.v.index_select(0, index)
