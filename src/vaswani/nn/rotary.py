"""Rotary position embedding (RoPE; Su et al. 2021, used by LLaMA).

Instead of adding a position vector to the embeddings, each query and key is rotated by an
angle proportional to its position: pairs of coordinates (x_i, x_{i + Dh/2}) turn by
``pos * base^(-2i/Dh)``. The dot product of a rotated query and key then depends only on
their distance. This is the "rotate half" layout of Hugging Face's LLaMA (GGUF files store
q/k weights permuted for the interleaved layout; the importer undoes that).

Shape legend: B batch, H heads, T length, Dh head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's rescaling of the frequencies for a longer context (``rope_type`` "llama3"):
    wavelengths longer than ``original_max_len / low_freq_factor`` are stretched by
    ``factor``, those shorter than ``original_max_len / high_freq_factor`` kept, and the ones
    between blended smoothly."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_len: int


def inv_frequencies(head_dim: int, base: float, scaling: RopeScaling | None = None,
                    device=None) -> Tensor:
    """The (Dh/2,) angular frequencies base^(-2i/Dh), in float32 computed as Hugging Face
    computes them (so that imported models agree to the last bit), rescaled by ``scaling``."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float()
    inv_freq = 1.0 / (base ** (exponents / head_dim))
    if scaling is None:
        return inv_freq
    s = scaling
    low_wavelen = s.original_max_len / s.low_freq_factor
    high_wavelen = s.original_max_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    stretched = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_len / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * stretched / s.factor + smooth * stretched
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, blended, stretched)


def rope_angles(positions: Tensor, head_dim: int, base: float,
                scaling: RopeScaling | None = None) -> tuple[Tensor, Tensor]:
    """positions (T,) or (B, T) -> cos, sin of shape (..., T, Dh), in float32."""
    inv_freq = inv_frequencies(head_dim, base, scaling, positions.device)  # (Dh/2,)
    angles = positions.float()[..., None] * inv_freq  # (..., T, Dh/2)
    angles = torch.cat([angles, angles], dim=-1)  # (..., T, Dh)
    return angles.cos(), angles.sin()


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, H, T, Dh); cos, sin (T, Dh) or (B, T, Dh). Returns x rotated, in x's dtype."""
    if cos.dim() == 3:  # per-sequence positions: broadcast over heads
        cos, sin = cos[:, None], sin[:, None]
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


class Rotary(nn.Module):
    """Rotary positions as a part of self-attention (:class:`~vaswani.nn.attention.
    MultiHeadAttention`'s ``rotary``): turns the queries and the keys by their tokens'
    positions, with frequencies ``base^(-2i/Dh)`` (rescaled by ``scaling`` when given). It
    holds no parameters; the angles are computed for the positions of each call."""

    def __init__(self, head_dim: int, base: float = 10000.0,
                 scaling: RopeScaling | None = None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary positions need an even head dim, got {head_dim}")
        self.head_dim, self.base, self.scaling = head_dim, base, scaling

    def forward(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, T, Dh), k (B, Hkv, T, Dh), positions (T,) or (B, T) -> both turned."""
        cos, sin = rope_angles(positions, self.head_dim, self.base, self.scaling)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def extra_repr(self) -> str:
        return f"base={self.base:g}" + ("" if self.scaling is None else f", {self.scaling}")
