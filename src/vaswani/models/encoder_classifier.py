"""Encoder-only classifier (BERT-style): embeddings, an encoder stack, pooling over the
sequence, and a linear head to class logits.

Pooling: ``"cls"`` takes the first position (put a [CLS]/BOS token there); ``"mean"``
averages the real (non-padding) positions.

With ``n_classes = 0`` the model has no head: it is a sentence encoder (an imported BERT),
used through :meth:`EncoderClassifier.sentence_embeddings` or fine-tuned with a head.

Shape legend: B batch, S length, D d_model, C classes, L layers, H heads.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from ..config.family import family
from ..nn import masks
from ..nn.dropout import Dropout
from ..nn.layers import Stack
from .common import embeddings, encoder_layer, final_norm, init_weights, stack_weights


def mean_pool(hidden: Tensor, keep: Tensor) -> Tensor:
    """hidden (B, S, D), keep (B, S) -> (B, D): the mean over real positions."""
    weights = keep.to(hidden.dtype).unsqueeze(-1)  # (B, S, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class EncoderClassifier(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        kind = family(config.arch)
        if not kind.encoder or kind.decoder:
            raise ValueError(f"EncoderClassifier needs an encoder-only arch, got {config.arch!r}")
        config.require_complete()
        c = self.config = config
        self.embed = embeddings(c, c.vocab_size)
        self.encoder = Stack([encoder_layer(c) for _ in range(c.n_encoder_layers)],
                             final_norm(c))
        self.dropout = Dropout(c.dropout)
        self.head = nn.Linear(c.d_model, c.n_classes) if c.n_classes else None
        init_weights(self, c.pad_id)

    def forward(self, ids: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """ids (B, S) -> class logits (B, C)."""
        if self.head is None:
            raise ValueError("this encoder has no classification head (n_classes = 0); "
                             "use it for embeddings, or fine-tune it on labelled data")
        if mask is None:
            mask = masks.padding_mask(ids, self.config.pad_id)
        return self.classify(self.encode(ids, mask=mask), mask)

    def encode(self, ids: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """ids (B, S) -> hidden states (B, S, D)."""
        return self._encode(ids, mask)[0]

    def encode_with_attention(self, ids: Tensor, *, mask: Tensor | None = None
                              ) -> tuple[Tensor, dict]:
        """:meth:`encode` and the self-attention weights of every layer, for looking inside
        the model: (hidden (B, S, D), {"encoder": (L, B, H, S, S)})."""
        hidden, weights = self._encode(ids, mask, need_weights=True)
        return hidden, {"encoder": stack_weights(weights, "self_attn")}

    def _encode(self, ids, mask, need_weights=False):
        if mask is None:
            mask = masks.padding_mask(ids, self.config.pad_id)
        return self.encoder(self.embed(ids), mask=masks.key_padding_mask(mask),
                            need_weights=need_weights)

    def pool(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """(B, S, D) -> (B, D) by the configured pooling."""
        return hidden[:, 0] if self.config.pooling == "cls" else mean_pool(hidden, mask)

    def classify(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """Hidden states (B, S, D) -> class logits (B, C): pool, dropout, head."""
        return self.head(self.dropout(self.pool(hidden, mask)))

    @staticmethod
    def sentence_embeddings(hidden: Tensor, mask: Tensor) -> Tensor:
        """Mean over real positions, L2-normalised (sentence-transformers' recipe):
        (B, S, D) -> (B, D) unit vectors."""
        return F.normalize(mean_pool(hidden, mask), dim=-1)
