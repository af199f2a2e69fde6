"""Transformer building blocks, written out. They take plain values and ready-made parts,
never a config: the paper's encoder layer is

    EncoderLayer(MultiHeadAttention(Heads(512, 8), Attention(0.1)),
                 FeedForward(512, 2048, dropout=0.1),
                 lambda: Residual(LayerNorm(512), 0.1))
"""

from . import masks
from .attention import Attention, Heads, MultiHeadAttention, scaled_dot_product_attention
from .feedforward import FeedForward
from .layers import DecoderLayer, EncoderLayer, LayerWeights, Residual, Stack
from .norm import LayerNorm, RMSNorm
from .positional import Embeddings, sinusoidal_table
from .rotary import Rotary

__all__ = [
    "Attention", "DecoderLayer", "Embeddings", "EncoderLayer", "FeedForward", "Heads",
    "LayerNorm", "LayerWeights", "MultiHeadAttention", "RMSNorm", "Residual", "Rotary", "Stack",
    "masks", "scaled_dot_product_attention", "sinusoidal_table",
]
