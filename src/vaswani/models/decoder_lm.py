"""Decoder-only language model (GPT-style): embeddings, a stack of decoder layers without
cross-attention under a causal mask, and a projection to vocabulary logits.

Shape legend: B batch, T length, D d_model, V vocabulary, L layers, H heads.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ..config import ModelConfig
from ..config.family import family
from ..nn.kv_cache import KVCache
from ..nn.layers import Stack
from .common import (
    at_last,
    decoder_inputs,
    decoder_layer,
    embeddings,
    final_norm,
    init_weights,
    output_projection,
    stack_weights,
)


class DecoderLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not family(config.arch).language_model:
            raise ValueError(f"DecoderLM needs a decoder-only arch, got {config.arch!r}")
        config.require_complete()
        c = self.config = config
        self.embed = embeddings(c, c.vocab_size)
        self.decoder = Stack([decoder_layer(c, i) for i in range(c.n_decoder_layers)],
                             final_norm(c))
        self.output_proj = output_projection(c, self.embed, c.vocab_size)
        init_weights(self, c.pad_id)

    def forward(self, ids: Tensor, *, mask: Tensor | bool | None = None,
                positions: Tensor | None = None, loss: Callable | None = None
                ) -> Tensor | tuple[Tensor, ...]:
        """ids: (B, T) -> logits (B, T, V); logits[:, t] predicts token t + 1.

        ``mask`` (B, T), True = real token, defaults to ``ids != pad_id``; ``True``: no
        padding, or padding only after the real tokens (attention is then causal alone, and
        SDPA's flash kernels may run: models/common.py ``decoder_inputs``); ``positions``
        (B, T) default to 0 .. T-1 (a left-padded batch passes its own). Decoding a token at
        a time over a cache is :meth:`decode_step`.

        ``loss(h, head)``, where given, is what the model returns instead of the logits: a
        criterion of the final hidden states ``h`` (B * T, D) that applies the vocabulary
        projection ``head`` itself, chunk by chunk (models/head_loss.py
        ``head_cross_entropy``), so that training never holds the (B, T, V) logits. It is
        called inside ``forward`` so that a wrapped model (DDP, FSDP) sees the projection
        used where its weights are gathered.
        """
        if loss is None:
            return self._forward(ids, mask, positions)[0]
        h, _ = self._hidden(ids, mask, positions)
        return loss(h.flatten(0, 1), self.output_proj)

    def forward_with_attention(self, ids: Tensor, *, mask: Tensor | None = None
                               ) -> tuple[Tensor, dict]:
        """:meth:`forward` and the self-attention weights of every layer, for looking inside
        the model: (logits (B, T, V), {"decoder": (L, B, H, T, T)})."""
        logits, weights = self._forward(ids, mask, None, need_weights=True)
        return logits, {"decoder": stack_weights(weights, "self_attn")}

    def _forward(self, ids, mask, positions, need_weights=False):
        h, weights = self._hidden(ids, mask, positions, need_weights)
        return self.output_proj(h), weights

    def _hidden(self, ids, mask, positions, need_weights=False):
        """The final hidden states (B, T, D), before the vocabulary projection."""
        default_positions, attn_mask = decoder_inputs(ids, mask, self.config.pad_id)
        x = self.embed(ids, positions=positions)
        positions = default_positions if positions is None else positions
        return self.decoder(x, mask=attn_mask, positions=positions, need_weights=need_weights)

    def decode_step(self, ids: Tensor, *, positions: Tensor, mask: Tensor | None, cache,
                    last: Tensor | None = None) -> Tensor:
        """Incremental decoding, for the reference decoders (a :class:`KVCache`) and the
        inference engine (its slot cache, engine/runner.py) alike: new tokens ``ids`` (B, T)
        at ``positions`` (B, T), a self-attention ``mask`` broadcastable to (B, 1, T, Tk)
        (None: every query sees every key) over the keys the ``cache`` returns (its layers
        add the new keys and values; ``KVCache.inputs`` gives positions and mask after what
        it holds) -> the next-token logits at ``last`` (B,), the position in each row whose
        logits are wanted: (B, V), only those positions reaching the output projection;
        ``last=None``: every position's, (B, T, V)."""
        h, _ = self.decoder(self.embed(ids, positions=positions), mask=mask, cache=cache,
                            positions=positions)
        return self.output_proj(h if last is None else at_last(h, last))

    def new_cache(self) -> KVCache:
        """An empty cache for incremental decoding with this model."""
        return KVCache(len(self.decoder.layers))
