"""Rotary position embedding (RoPE; Su et al. 2021, used by LLaMA).

Instead of adding a position vector to the embeddings, each query and key is rotated by an
angle proportional to its position: pairs of coordinates (x_i, x_{i + Dh/2}) turn by
``pos * base^(-2i/Dh)``. The dot product of a rotated query and key then depends only on
their distance. This is the "rotate half" layout of Hugging Face's LLaMA (GGUF files store
q/k weights permuted for the interleaved layout; the importer undoes that).

Shape legend: B batch, H heads, T length, Dh head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rope_angles(positions: Tensor, head_dim: int, base: float) -> tuple[Tensor, Tensor]:
    """positions (T,) or (B, T) -> cos, sin of shape (..., T, Dh), in float32."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=positions.device,
                                      dtype=torch.float32) / head_dim)  # (Dh/2,)
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
