"""The paper's model: an encoder stack over the source, a decoder stack over the target that
attends to the encoder's output (the "memory"), and a projection to target-vocabulary logits.

Shape legend: B batch, S source length, T target length, D d_model, V target vocabulary.
Masks passed in are ``(B, L)`` booleans, True = real token; by default they come from
``config.pad_id``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..nn import masks
from ..nn.kv_cache import KVCache
from ..nn.layers import DecoderLayer, EncoderLayer, Stack
from .common import embeddings, final_norm, init_weights, layer_options, output_projection


class EncoderDecoder(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.arch != "encoder-decoder":
            raise ValueError(f"EncoderDecoder needs arch 'encoder-decoder', got {config.arch!r}")
        config.require_complete()
        c = self.config = config
        opts = layer_options(c)
        self.src_embed = embeddings(c, c.vocab_size)
        self.tgt_embed = self.src_embed if c.share_embeddings else embeddings(
            c, c.target_vocab_size)
        self.encoder = Stack([EncoderLayer(c.d_model, c.n_heads, c.d_ff, **opts)
                              for _ in range(c.encoder_depth)], final_norm(c))
        self.decoder = Stack([DecoderLayer(c.d_model, c.n_heads, c.d_ff, **opts)
                              for _ in range(c.decoder_depth)], final_norm(c))
        self.output_proj = output_projection(c, self.tgt_embed, c.target_vocab_size)
        init_weights(self, c.pad_id)

    def encode(self, src: Tensor, *, src_mask: Tensor | None = None,
               need_weights: bool = False) -> Tensor:
        """src: (B, S) ids -> memory (B, S, D). src_mask: (B, S), True = real token."""
        if src_mask is None:
            src_mask = masks.padding_mask(src, self.config.pad_id)
        attn_mask = masks.key_padding_mask(src_mask)  # (B, 1, 1, S)
        return self.encoder(self.src_embed(src), mask=attn_mask, need_weights=need_weights)

    def decode(self, tgt: Tensor, memory: Tensor, *, src_mask: Tensor | None,
               tgt_mask: Tensor | None = None, cache: KVCache | None = None,
               need_weights: bool = False) -> Tensor:
        """tgt: (B, T) ids, memory: (B, S, D) -> logits (B, T, V).

        ``src_mask`` (B, S) is required (pass None only for an unpadded source): cross-attention
        must not look at source padding. ``tgt_mask`` (B, T) defaults to the target padding.

        Incremental decoding: pass a ``KVCache`` and only the new target tokens; their
        positions continue from ``cache.length`` and they attend to every cached token
        (``tgt_mask``, if given, then covers cached + new tokens). The memory's keys and
        values are projected on the first step and taken from the cache afterwards.
        """
        T = tgt.size(1)
        start = 0 if cache is None else cache.length
        if cache is None and tgt_mask is None:
            tgt_mask = masks.padding_mask(tgt, self.config.pad_id)
        positions = torch.arange(start, start + T, device=tgt.device)
        if tgt_mask is None and T == 1:
            self_mask = None  # one new query may see every key: no mask needed
        else:
            self_mask = masks.decoder_self_mask(tgt_mask, T, start + T, device=tgt.device)
        memory_mask = None if src_mask is None else masks.key_padding_mask(src_mask)
        h = self.decoder(self.tgt_embed(tgt, positions=positions), memory=memory,
                         mask=self_mask, memory_mask=memory_mask, cache=cache,
                         positions=positions, need_weights=need_weights)
        return self.output_proj(h)

    def new_cache(self) -> KVCache:
        """An empty cache for incremental decoding with this model."""
        return KVCache(len(self.decoder.layers))

    def forward(self, src: Tensor, tgt: Tensor, *, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        """Teacher-forced logits: src (B, S), tgt (B, T) -> (B, T, V). For training, feed
        ``tgt[:, :-1]`` and score against ``tgt[:, 1:]``."""
        if src_mask is None:
            src_mask = masks.padding_mask(src, self.config.pad_id)
        memory = self.encode(src, src_mask=src_mask)
        return self.decode(tgt, memory, src_mask=src_mask, tgt_mask=tgt_mask)
