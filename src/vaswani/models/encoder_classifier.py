"""Encoder-only classifier (BERT-style): embeddings, an encoder stack, pooling over the
sequence, and a linear head to class logits.

Pooling: ``"cls"`` takes the first position (put a [CLS]/BOS token there); ``"mean"``
averages the real (non-padding) positions.

Shape legend: B batch, S length, D d_model, C classes.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..config import ModelConfig
from ..nn import masks
from ..nn.dropout import Dropout
from ..nn.layers import EncoderLayer, Stack
from .common import embeddings, final_norm, init_weights, layer_options


def mean_pool(hidden: Tensor, keep: Tensor) -> Tensor:
    """hidden (B, S, D), keep (B, S) -> (B, D): the mean over real positions."""
    weights = keep.to(hidden.dtype).unsqueeze(-1)  # (B, S, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class EncoderClassifier(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.arch != "encoder":
            raise ValueError(f"EncoderClassifier needs arch 'encoder', got {config.arch!r}")
        config.require_complete()
        c = self.config = config
        self.embed = embeddings(c, c.vocab_size)
        self.encoder = Stack([EncoderLayer(c.d_model, c.n_heads, c.d_ff, **layer_options(c))
                              for _ in range(c.encoder_depth)], final_norm(c))
        self.dropout = Dropout(c.dropout)
        self.head = nn.Linear(c.d_model, c.n_classes)
        init_weights(self, c.pad_id)

    def encode(self, ids: Tensor, *, mask: Tensor | None = None,
               need_weights: bool = False) -> Tensor:
        """ids (B, S) -> hidden states (B, S, D)."""
        if mask is None:
            mask = masks.padding_mask(ids, self.config.pad_id)
        return self.encoder(self.embed(ids), mask=masks.key_padding_mask(mask),
                            need_weights=need_weights)

    def pool(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """(B, S, D) -> (B, D) by the configured pooling."""
        return hidden[:, 0] if self.config.pooling == "cls" else mean_pool(hidden, mask)

    def forward(self, ids: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """ids (B, S) -> class logits (B, C)."""
        if mask is None:
            mask = masks.padding_mask(ids, self.config.pad_id)
        pooled = self.pool(self.encode(ids, mask=mask), mask)
        return self.head(self.dropout(pooled))
