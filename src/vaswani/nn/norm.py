"""Normalisation layers, written out. Shape: any (..., D); statistics over the last dim."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LayerNorm(nn.Module):
    """(x - mean) / sqrt(var + eps) * g + b, with the *biased* variance (divide by D).

    ``reference`` writes the formula out; ``forward`` computes the same with PyTorch's fused
    ``F.layer_norm`` kernel (one pass instead of five, which matters when decoding one token
    at a time). Tests check that both equal ``nn.LayerNorm``.

    Tutorials often write ``(x - mean) / (x.std() + eps)``: ``std`` is unbiased (divides by
    D - 1) and eps sits outside the root, which is a different function from the paper's.
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)

    def reference(self, x: Tensor) -> Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
        y = (x - mean) * torch.rsqrt(var + self.eps) * self.weight
        return y if self.bias is None else y + self.bias


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g (Zhang & Sennrich 2019; LLaMA). No centring, no bias."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def make_norm(kind: str, d_model: int, eps: float, bias: bool = True) -> nn.Module:
    """``"layernorm"`` or ``"rmsnorm"``."""
    if kind == "layernorm":
        return LayerNorm(d_model, eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(d_model, eps)
    raise ValueError(f"norm ({kind!r}) must be 'layernorm' or 'rmsnorm'")
