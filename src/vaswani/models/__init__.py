"""The three model families and :func:`build_model`."""

from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from .decoder_lm import DecoderLM
from .encoder_classifier import EncoderClassifier
from .encoder_decoder import EncoderDecoder

ARCHITECTURES: dict[str, type[nn.Module]] = {
    "encoder-decoder": EncoderDecoder,
    "decoder": DecoderLM,
    "encoder": EncoderClassifier,
}


def build_model(config: ModelConfig) -> nn.Module:
    """The model for ``config.arch``, freshly initialised; ``model.config is config``."""
    return ARCHITECTURES[config.arch](config)


def parameter_counts(model: nn.Module) -> tuple[list[tuple[str, int]], int]:
    """(parameters of each top-level part, total with shared (tied) weights counted once)."""
    parts = [(name, sum(p.numel() for p in child.parameters()))
             for name, child in model.named_children()]
    return parts, sum(p.numel() for p in model.parameters())


__all__ = ["ARCHITECTURES", "DecoderLM", "EncoderClassifier", "EncoderDecoder", "build_model",
           "parameter_counts"]
