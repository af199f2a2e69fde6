"""Attention masks: the only place masks are built.

One convention everywhere: a boolean tensor, ``True`` = this query may attend to this key,
broadcastable to ``(B, H, Tq, Tk)``. This is the convention of
``torch.nn.functional.scaled_dot_product_attention``. (``torch.nn.MultiheadAttention`` uses the
opposite polarity for its boolean masks, True = ignore; invert when talking to it.)

One exception, for speed: a causal mask with no padding beside it is a :class:`Causal`, a
description rather than a tensor. The attention runs it as SDPA's ``is_causal``, which its
flash kernels take (they take no explicit mask, and an explicit causal mask makes every
kernel compute the scores it then throws away); :func:`dense` builds the tensor where one is
needed (the written-out attention, a mask combined with another).

Shape legend: B batch, Tq query length, Tk key length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Causal:
    """:func:`causal_mask` ``(q_len, k_len)``, not built (see the module's docstring)."""

    q_len: int
    k_len: int


Mask = Tensor | Causal


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


def causal(q_len: int, k_len: int | None = None) -> Causal:
    """:func:`causal_mask`, bottom-right aligned as it is, as a :class:`Causal`."""
    return Causal(q_len, q_len if k_len is None else k_len)


def dense(mask: Mask | None, device=None) -> Tensor | None:
    """A mask as a boolean tensor: a :class:`Causal` built on ``device``, a tensor or None
    as it is."""
    return causal_mask(mask.q_len, mask.k_len, device=device) if isinstance(mask, Causal) \
        else mask


def combine(*masks: Mask | None) -> Mask | None:
    """Logical AND of broadcastable masks; ``None`` entries mean "no restriction"."""
    given = [m for m in masks if m is not None]
    if len(given) > 1:  # a causal description is built beside another mask
        device = next((m.device for m in given if isinstance(m, Tensor)), None)
        given = [dense(m, device) for m in given]
    out = None
    for m in given:
        out = m if out is None else out & m
    return out


def decoder_self_mask(keep: Tensor | None, q_len: int, k_len: int | None = None, *,
                      device=None) -> Mask:
    """Causal self-attention mask, combined with key padding when ``keep`` ``(B, Tk)`` is given.

    Returns ``(B, 1, Tq, Tk)`` with padding; without, :func:`causal` (no tensor: SDPA's
    flash kernels may run).
    """
    if keep is None:
        return causal(q_len, k_len)
    return combine(key_padding_mask(keep), causal_mask(q_len, k_len, device=device))


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

