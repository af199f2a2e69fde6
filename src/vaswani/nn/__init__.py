"""Transformer building blocks, written out. They take plain arguments, never a config."""

from . import masks
from .attention import MultiHeadAttention, scaled_dot_product_attention
from .feedforward import FeedForward
from .layers import DecoderLayer, EncoderLayer, LayerOptions, LayerWeights, Stack
from .norm import LayerNorm, RMSNorm
from .positional import Embeddings, sinusoidal_table

__all__ = [
    "DecoderLayer", "Embeddings", "EncoderLayer", "FeedForward", "LayerNorm", "LayerOptions",
    "LayerWeights",
    "MultiHeadAttention", "RMSNorm", "Stack", "masks", "scaled_dot_product_attention",
    "sinusoidal_table",
]
