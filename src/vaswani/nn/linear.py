"""``Linear``: ``torch.nn.Linear``, which can also apply some of its output rows alone.

Shapes: (..., in) -> (..., out), as ``nn.Linear``.

Multi-head attention keeps W_q, W_k and W_v stacked in one matrix (one product for
self-attention); cross-attention projects its queries with the first rows and the encoder's
memory with the rest: ``rows(x, start, stop)`` is that product. On a CPU, faster layers
(vaswani.cpu) take its place in a built model and keep ``rows``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class Linear(nn.Linear):
    def rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """x (..., in) -> (..., stop - start): the output rows ``start:stop``."""
        bias = None if self.bias is None else self.bias[start:stop]
        return F.linear(x, self.weight[start:stop], bias)
