"""Greedy decoding for the encoder-decoder: at each step take the most likely next token.

Shape legend: B batch, S source length, T target length so far.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..models import EncoderDecoder


@torch.no_grad()
def greedy_decode(model: EncoderDecoder, src: Tensor, *, bos_id: int, eos_id: int,
                  max_len_a: float = 1.5, max_len_b: int = 10) -> list[list[int]]:
    """src (B, S) padded ids -> one list of output ids per sentence (without bos/eos).

    A sentence stops at its first ``<eos>``; none runs past ``max_len_a * S_i + max_len_b``
    tokens (S_i: that sentence's real length) or the model's ``max_len``.
    """
    pad_id = model.config.pad_id
    src_mask = src != pad_id  # (B, S)
    memory = model.encode(src, src_mask=src_mask)
    B = src.size(0)
    limits = (src_mask.sum(1).float() * max_len_a + max_len_b).long().clamp(
        max=model.config.max_len - 1)  # (B,)
    out = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    for t in range(int(limits.max())):
        logits = model.decode(out, memory, src_mask=src_mask)[:, -1]  # (B, V)
        next_id = logits.argmax(-1).masked_fill(done, pad_id)
        out = torch.cat([out, next_id[:, None]], dim=1)
        done |= (next_id == eos_id) | (t + 1 >= limits)
        if bool(done.all()):
            break
    results = []
    for row in out[:, 1:].tolist():
        ids = []
        for i in row:
            if i in (eos_id, pad_id):
                break
            ids.append(i)
        results.append(ids)
    return results
