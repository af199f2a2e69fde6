"""Decoder-only language model (GPT-style): embeddings, a stack of decoder layers without
cross-attention under a causal mask, and a projection to vocabulary logits.

Shape legend: B batch, T length, D d_model, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..nn import masks
from ..nn.kv_cache import KVCache
from ..nn.layers import DecoderLayer, Stack
from .common import embeddings, final_norm, init_weights, layer_options, output_projection


class DecoderLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.arch != "decoder":
            raise ValueError(f"DecoderLM needs arch 'decoder', got {config.arch!r}")
        config.require_complete()
        c = self.config = config
        self.embed = embeddings(c, c.vocab_size)
        self.decoder = Stack([DecoderLayer(c.d_model, c.n_heads, c.d_ff, cross_attention=False,
                                           **layer_options(c))
                              for _ in range(c.decoder_depth)], final_norm(c))
        self.output_proj = output_projection(c, self.embed, c.vocab_size)
        init_weights(self, c.pad_id)

    def forward(self, ids: Tensor, *, mask: Tensor | None = None,
                positions: Tensor | None = None, cache: KVCache | None = None,
                need_weights: bool = False) -> Tensor:
        """ids: (B, T) -> logits (B, T, V); logits[:, t] predicts token t + 1.

        ``mask`` (B, T), True = real token, defaults to ``ids != pad_id``.

        Incremental decoding: pass a ``KVCache`` and only the new tokens. Positions continue
        from ``cache.length`` unless given (left-padded batches pass their own), and ``mask``,
        if given, covers cached + new tokens (B, T_cached + T).
        """
        T = ids.size(1)
        start = 0 if cache is None else cache.length
        if cache is None and mask is None:
            mask = masks.padding_mask(ids, self.config.pad_id)
        if positions is None:
            positions = torch.arange(start, start + T, device=ids.device)
        if mask is None and T == 1:
            attn_mask = None  # one new query may see every key
        else:
            attn_mask = masks.decoder_self_mask(mask, T, start + T, device=ids.device)
        h = self.decoder(self.embed(ids, positions=positions), mask=attn_mask, cache=cache,
                         positions=positions, need_weights=need_weights)
        return self.output_proj(h)

    def new_cache(self) -> KVCache:
        """An empty cache for incremental decoding with this model."""
        return KVCache(len(self.decoder.layers))
