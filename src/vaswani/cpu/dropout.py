"""Dropout on a CPU, four elements' decisions from one random draw.

On a CPU, ``torch.nn.functional.dropout`` spends most of its time drawing one random number
per element (``bernoulli_``): in a bf16 training step of the paper's base model that is about
a fifth of the whole step (docs/performance.md). Here one 64-bit random integer gives the
keep/drop decisions of four elements (one 16-bit lane each), so a quarter of the random
numbers are drawn, and the 0/1 mask is made in ``x``'s own dtype (mixed bool x bf16 products
are slow); in float32 the mask holds the scale (0 or 1 / (1 - p)), so that ``x`` and its
gradient are multiplied once, not twice, with the same result to the bit (bf16 cannot hold
1 / (1 - p) closely enough: 1 / 0.9 would become 1.109, so there ``x * mask`` is scaled
after). The probability is rounded to a multiple of 1/65536 (0.1 becomes 0.099998...), and
the scale uses the rounded value, so the expectation is exactly preserved. On another device
PyTorch's fused kernel is used. Both follow ``torch.manual_seed``.

:func:`reference_dropout` writes the textbook formula out (a uniform number per element, keep
it when >= p, divide the survivors by 1 - p) from the same random numbers; a test checks the
two agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..nn.dropout import Dropout, check_probability

_LANES = 65536  # values of one 16-bit lane


def random_lanes(shape: torch.Size) -> Tensor:
    """Random int16 values, uniform over [-32768, 32767], four from each 64-bit draw."""
    n = shape.numel()
    bits = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64)
    return bits.view(torch.int16)[:n].view(shape)


def lane_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of ``x`` with drop probability ``p`` (identity when not training)."""
    if not training or p == 0.0:
        return x
    check_probability(p)
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    drop = round(p * _LANES)  # lanes below -32768 + drop are dropped
    keep = (random_lanes(x.shape) >= drop - _LANES // 2).to(x.dtype)  # 1 = keep, 0 = drop
    scale = _LANES / (_LANES - drop)
    if x.dtype in (torch.float32, torch.float64):  # the mask holds the scale: one product
        return x * keep.mul_(scale)
    return (x * keep).mul_(scale)  # bf16 and fp16 would round 1 / (1 - p) in the mask


def reference_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """The formula written out, from the same random numbers as :func:`lane_dropout` (CPU):
    u ~ U[0, 1) per element, keep x / (1 - p) where u >= p, else 0 (p rounded to a multiple
    of 1/65536, as there)."""
    if not training or p == 0.0:
        return x
    check_probability(p)
    p = round(p * _LANES) / _LANES
    u = (random_lanes(x.shape).double() + _LANES // 2) / _LANES  # uniform in [0, 1)
    return torch.where(u.to(x.device) >= p, x / (1 - p), torch.zeros_like(x))


class LaneDropout(Dropout):
    """:class:`~vaswani.nn.dropout.Dropout` through :func:`lane_dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        return lane_dropout(x, self.p, self.training)

    def reference(self, x: Tensor) -> Tensor:
        return reference_dropout(x, self.p, self.training)
