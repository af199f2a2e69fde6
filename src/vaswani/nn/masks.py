"""Attention masks: the only place masks are built.

One convention everywhere: a boolean tensor, ``True`` = this query may attend to this key,
broadcastable to ``(B, H, Tq, Tk)``. This is the convention of
``torch.nn.functional.scaled_dot_product_attention``. (``torch.nn.MultiheadAttention`` uses the
opposite polarity for its boolean masks, True = ignore; invert when talking to it.)

Shape legend: B batch, Tq query length, Tk key length.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """``(B, T)`` token ids -> ``(B, T)`` bool, True where the token is real (not padding)."""
    return ids != pad_id


def key_padding_mask(keep: Tensor) -> Tensor:
    """``(B, Tk)`` True-for-real-token -> ``(B, 1, 1, Tk)``: every query sees every real key."""
    return keep[:, None, None, :]


def causal_mask(q_len: int, k_len: int | None = None, *, device=None) -> Tensor:
    """``(Tq, Tk)`` lower-triangular mask, aligned at the bottom-right corner.

    Query ``i`` is the token at absolute position ``Tk - Tq + i`` (the last ``Tq`` of ``Tk``
    positions), so it may attend to keys ``0 .. Tk - Tq + i``. With ``Tq == Tk`` this is the
    usual triangle; with a KV cache (``Tq < Tk``) the new queries see all cached keys.
    (``F.scaled_dot_product_attention(is_causal=True)`` is aligned top-left instead, which is
    wrong whenever ``Tq != Tk``.)
    """
    k_len = q_len if k_len is None else k_len
    if k_len < q_len:
        raise ValueError(f"causal mask needs k_len ({k_len}) >= q_len ({q_len})")
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    return ones.tril(diagonal=k_len - q_len)


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of broadcastable masks; ``None`` entries mean "no restriction"."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else out & m
    return out


def decoder_self_mask(keep: Tensor | None, q_len: int, k_len: int | None = None, *,
                      device=None) -> Tensor:
    """Causal self-attention mask, combined with key padding when ``keep`` ``(B, Tk)`` is given.

    Returns ``(Tq, Tk)`` without padding or ``(B, 1, Tq, Tk)`` with it.
    """
    causal = causal_mask(q_len, k_len, device=device)
    return causal if keep is None else combine(key_padding_mask(keep), causal)


def position_mask(q_positions: Tensor, k_len: int) -> Tensor:
    """``(B, Tq)`` positions of each row's queries, against keys at positions ``0 .. Tk-1`` of
    the same row -> ``(B, 1, Tq, Tk)``: a query sees the keys at or before its own position.

    The causal mask of rows that are at different lengths (generations batched together,
    where each row's keys are its cached tokens from position 0): bottom-right alignment
    per row, and a row's keys past its own length are hidden from it."""
    keys = torch.arange(k_len, device=q_positions.device)
    return keys[None, None, None, :] <= q_positions[:, None, :, None]


def length_mask(lengths: Tensor, k_len: int) -> Tensor:
    """``(B,)`` real lengths -> ``(B, 1, 1, Tk)``: every query sees each row's first
    ``lengths[b]`` keys (a padded batch of sources, for cross-attention)."""
    keys = torch.arange(k_len, device=lengths.device)
    return key_padding_mask(keys[None, :] < lengths[:, None])


def window_mask(q_positions: Tensor, k_len: int, window: int) -> Tensor:
    """Local attention (Gemma 3's sliding layers): a query at position p sees only the keys at
    positions ``p - window + 1 .. p``, the last ``window`` tokens, itself included. Keys are
    at positions ``0 .. Tk-1``. ``q_positions`` (Tq,) -> ``(Tq, Tk)``; (B, Tq) ->
    ``(B, 1, Tq, Tk)``. Combine it with the causal mask, which hides the keys after p."""
    keys = torch.arange(k_len, device=q_positions.device)
    out = keys > q_positions[..., None] - window  # (..., Tq, Tk)
    return out if q_positions.dim() == 1 else out[:, None]
