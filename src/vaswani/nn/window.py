"""Local attention (a sliding window; Beltagy et al. 2020, Mistral, Gemma 3's local layers):
each query sees only the last ``window`` tokens, itself included, instead of every token
before it. A layer's cost then stops growing with the context: a query reads at most
``window`` keys.

It is a mask like the others (True = may attend), combined with the causal one, which hides
the keys after the query. Shape legend: B batch, Tq queries, Tk keys.
"""

from __future__ import annotations

import torch
from torch import Tensor


def window_mask(q_positions: Tensor, k_len: int, window: int) -> Tensor:
    """A query at position p sees only the keys at positions ``p - window + 1 .. p``. Keys
    are at positions ``0 .. Tk-1``. ``q_positions`` (Tq,) -> ``(Tq, Tk)``; (B, Tq) ->
    ``(B, 1, Tq, Tk)``."""
    keys = torch.arange(k_len, device=q_positions.device)
    out = keys > q_positions[..., None] - window  # (..., Tq, Tk)
    return out if q_positions.dim() == 1 else out[:, None]
