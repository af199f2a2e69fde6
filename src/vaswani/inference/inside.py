"""Looking inside a run (the attention explorer, teacher-forced probabilities): the helpers
the use classes share."""

from __future__ import annotations

import torch
from torch import Tensor

from ..data.tokenizers import Tokenizer


def as_batch(ids: list[int], device: torch.device) -> Tensor:
    """One sequence of ids as a (1, T) batch."""
    return torch.tensor([ids], dtype=torch.long, device=device)


def token_labels(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """A readable label per token id (for attention plots)."""
    return [tokenizer.token(i) for i in ids]


def next_token_probabilities(logits: Tensor, ids: list[int], labels: list[str],
                             last: tuple[int, str] | None = None) -> list[dict]:
    """For each position t of a teacher-forced (1, T, V) ``logits``, the probability it gave
    the next token ``ids[t + 1]`` (``last``: (id, label) of what follows the final position),
    labelled with that token."""
    probs = logits[0].float().softmax(-1)
    out = []
    follow = list(zip(ids[1:], labels[1:], strict=True)) + ([last] if last else [])
    for t, (i, label) in enumerate(follow):
        out.append({"token": label, "p": round(float(probs[t, i]), 5)})
    return out


def attention_map(weights: Tensor, queries: list[str], keys: list[str]) -> dict:
    """One kind of attention of one input: (L, H, Tq, Tk) weights and the token labels."""
    return {"weights": weights.float().cpu(), "queries": queries, "keys": keys}
