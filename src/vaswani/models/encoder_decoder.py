"""The paper's model: an encoder stack over the source, a decoder stack over the target that
attends to the encoder's output (the "memory"), and a projection to target-vocabulary logits.

Shape legend: B batch, S source length, T target length, D d_model, V target vocabulary,
L layers, H heads. Masks passed in are ``(B, L)`` booleans, True = real token; by default they
come from ``config.pad_id``.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..config import ModelConfig
from ..config.family import family
from ..nn import masks
from ..nn.kv_cache import KVCache
from ..nn.layers import Stack
from .common import (
    at_last,
    decoder_inputs,
    decoder_layer,
    embeddings,
    encoder_layer,
    final_norm,
    init_weights,
    output_projection,
    stack_weights,
)


class EncoderDecoder(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not family(config.arch).cross:
            raise ValueError(f"EncoderDecoder needs an encoder-decoder arch, got {config.arch!r}")
        config.require_complete()
        c = self.config = config
        self.src_embed = embeddings(c, c.vocab_size)
        self.tgt_embed = self.src_embed if c.share_embeddings else embeddings(
            c, c.tgt_vocab_size)
        self.encoder = Stack([encoder_layer(c) for _ in range(c.n_encoder_layers)],
                             final_norm(c))
        self.decoder = Stack([decoder_layer(c, i, cross=True) for i in range(c.n_decoder_layers)],
                             final_norm(c))
        self.output_proj = output_projection(c, self.tgt_embed, c.tgt_vocab_size)
        init_weights(self, c.pad_id)

    def forward(self, src: Tensor, tgt: Tensor, *, src_mask: Tensor | bool | None = None,
                tgt_mask: Tensor | bool | None = None) -> Tensor:
        """Teacher-forced logits: src (B, S), tgt (B, T) -> (B, T, V). For training, feed
        ``tgt[:, :-1]`` and score against ``tgt[:, 1:]``.

        ``src_mask`` (B, S) and ``tgt_mask`` (B, T), True = real token, default to the
        padding. ``True`` says there is none to mask: no source padding; target padding only
        after the real tokens, which causal attention never shows a real token (a training
        batch's). No mask is then built, and SDPA's flash kernels may run."""
        keep = self._source_mask(src, src_mask)
        memory = self._encode(src, keep)[0]
        return self._decode(tgt, memory, keep, tgt_mask)[0]

    def encode(self, src: Tensor, *, src_mask: Tensor | bool | None = None) -> Tensor:
        """src: (B, S) ids -> memory (B, S, D). src_mask: (B, S), True = real token (``True``:
        no padding)."""
        return self._encode(src, self._source_mask(src, src_mask))[0]

    def decode(self, tgt: Tensor, memory: Tensor, *, src_mask: Tensor | None,
               tgt_mask: Tensor | bool | None = None) -> Tensor:
        """tgt: (B, T) ids, memory: (B, S, D) -> logits (B, T, V).

        ``src_mask`` (B, S) is required (pass None only for an unpadded source): cross-attention
        must not look at source padding. ``tgt_mask`` (B, T) defaults to the target padding.
        Decoding a token at a time over a cache is :meth:`decode_step`.
        """
        return self._decode(tgt, memory, src_mask, tgt_mask)[0]

    def forward_with_attention(self, src: Tensor, tgt: Tensor, *, src_mask: Tensor | None = None,
                               tgt_mask: Tensor | None = None) -> tuple[Tensor, dict]:
        """:meth:`forward` and every attention weight, for looking inside the model:
        (logits (B, T, V), {"encoder": (L, B, H, S, S), "decoder": (L, B, H, T, T),
        "cross": (L, B, H, T, S)}). The weights come from the written-out attention."""
        keep = self._source_mask(src, src_mask)
        memory, enc = self._encode(src, keep, need_weights=True)
        logits, dec = self._decode(tgt, memory, keep, tgt_mask, need_weights=True)
        return logits, {"encoder": stack_weights(enc, "self_attn"),
                        "decoder": stack_weights(dec, "self_attn"),
                        "cross": stack_weights(dec, "cross_attn")}

    def _source_mask(self, src: Tensor, src_mask: Tensor | bool | None) -> Tensor | None:
        """The source's (B, S) mask as given, else its padding (the one default); None for
        ``True`` (no padding)."""
        if src_mask is True:
            return None
        return masks.padding_mask(src, self.config.pad_id) if src_mask is None else src_mask

    def _encode(self, src, keep, need_weights=False):
        """``keep`` (B, S), or None: no source padding."""
        attn_mask = None if keep is None else masks.key_padding_mask(keep)  # (B, 1, 1, S)
        return self.encoder(self.src_embed(src), mask=attn_mask, need_weights=need_weights)

    def _decode(self, tgt, memory, src_mask, tgt_mask, need_weights=False):
        positions, self_mask = decoder_inputs(tgt, tgt_mask, self.config.pad_id)
        memory_mask = None if src_mask is None else masks.key_padding_mask(src_mask)
        h, weights = self.decoder(self.tgt_embed(tgt), mask=self_mask, memory=memory,
                                  memory_mask=memory_mask, positions=positions,
                                  need_weights=need_weights)
        return self.output_proj(h), weights

    def cross_keys_values(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each decoder layer's cross-attention keys and values of an encoded source
        (B, S, D): a list of ((B, Hkv, S, Dh), (B, Hkv, S, Dh)), one per layer. The inference
        engine computes them once per request and keeps them in its cache."""
        return [layer.cross_attn.project_kv(memory) for layer in self.decoder.layers]

    def decode_step(self, ids: Tensor, *, positions: Tensor, mask: Tensor | None, cache,
                    memory_mask: Tensor | None, memory: Tensor | None = None,
                    last: Tensor | None = None) -> Tensor:
        """Incremental decoding, as :meth:`DecoderLM.decode_step`, over the encoded source:
        its keys and values come from the ``cache`` (the engine computes them once per
        request: :meth:`cross_keys_values`), or from ``memory`` (B, S, D) on a
        :class:`KVCache`'s first step; ``memory_mask`` broadcastable to (B, 1, 1, S), the
        source's padding (None: none) -> next-token logits (B, V) at ``last`` (None: every
        position's, (B, T, V))."""
        h, _ = self.decoder(self.tgt_embed(ids, positions=positions), mask=mask, memory=memory,
                            memory_mask=memory_mask, cache=cache, positions=positions)
        return self.output_proj(h if last is None else at_last(h, last))

    def new_cache(self) -> KVCache:
        """An empty cache for incremental decoding with this model."""
        return KVCache(len(self.decoder.layers))
