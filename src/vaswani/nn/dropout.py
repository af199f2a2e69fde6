"""Dropout: zero each element with probability p, scale the survivors by 1 / (1 - p).

"Inverted" dropout (section 5.4 of the paper, P_drop = 0.1): scaling while training keeps each
element's expectation, so evaluation needs no scaling at all. On a CPU a built model draws
its random numbers four elements at a time instead (vaswani.cpu.dropout, the same formula).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def check_probability(p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability ({p}) must be in [0, 1)")


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of ``x`` with drop probability ``p`` (identity when not training)."""
    if not training or p == 0.0:
        return x
    check_probability(p)
    return F.dropout(x, p, training=True)


class Dropout(nn.Module):
    """Module form of :func:`dropout` (drop-in for ``torch.nn.Dropout``)."""

    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        check_probability(p)
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
