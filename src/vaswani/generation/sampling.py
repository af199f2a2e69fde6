"""Choosing the next token of many rows at once, each with its own settings: greedy (argmax),
or sampled with temperature, top-k and top-p, from its own random generator.

Sampling uses the exponential race: for probabilities ``p`` draw ``E_i ~ Exp(1)`` for every
vocabulary entry and pick ``argmax p_i / E_i``, which is entry i with probability ``p_i``
(``E_i / p_i`` is exponential with rate ``p_i``; the smallest of independent exponentials is
i with probability proportional to its rate). Unlike ``torch.multinomial`` it is one
element-wise pass and an argmax, the same for one row or many, and a row with a seed draws
from its own generator exactly one vector per token, whatever else is in the batch: the
engine's batched rows and a request decoded alone pick the same tokens.

Shapes: N rows, V vocabulary.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


def sample_rows(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor,
                generators: list[torch.Generator | None]) -> Tensor:
    """logits (N, V); temperature (N,) (0 = greedy), top_k (N,) (0 = off), top_p (N,)
    (1 = off); one generator per row (None: the default one) -> tokens (N,).

    ``top_k`` keeps the k likeliest tokens; ``top_p`` then keeps the smallest set whose
    probability reaches p (the likeliest token always stays)."""
    greedy = (temperature == 0) | (top_k == 1)
    tokens = first_max(logits)
    if bool(greedy.all()):
        return tokens
    scaled = logits.float() / torch.where(greedy, 1.0, temperature)[:, None]
    ordered = scaled.sort(dim=-1, descending=True).values
    if bool((top_k > 0).any()):  # below each row's k-th largest score: out
        kth = ordered.gather(1, (top_k.clamp(min=1, max=logits.size(-1)) - 1)[:, None])
        scaled = scaled.masked_fill((top_k[:, None] > 0) & (scaled < kth), float("-inf"))
        ordered = scaled.sort(dim=-1, descending=True).values
    if bool((top_p < 1).any()):  # past the smallest set whose probability reaches p: out
        probs = ordered.softmax(-1)
        before = probs.cumsum(-1) - probs  # probability of the tokens ranked above
        keep = (before < top_p[:, None]).sum(-1, keepdim=True)  # how many stay (>= 1)
        cutoff = ordered.gather(1, keep - 1)
        scaled = scaled.masked_fill((top_p[:, None] < 1) & (scaled < cutoff), float("-inf"))
    race = exponential_race(scaled.softmax(-1), generators)
    return torch.where(greedy, tokens, race)


def exponential_race(probs: Tensor, generators: list[torch.Generator | None]) -> Tensor:
    """One token per row of probs (N, V): argmax p / E, E ~ Exp(1) drawn from the row's
    generator (rows without one share a draw from the default generator); a generator on
    another device than ``probs`` draws there."""
    draws = torch.empty_like(probs)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        draws[shared] = torch.empty(len(shared), probs.size(-1), device=probs.device,
                                    dtype=probs.dtype).exponential_()
    for i, g in enumerate(generators):
        if g is None:
            continue
        if g.device == probs.device:
            draws[i].exponential_(generator=g)
        else:  # e.g. a CPU generator for logits on a GPU: drawn where it lives, then moved
            draws[i] = torch.empty(probs.size(-1), device=g.device,
                                   dtype=probs.dtype).exponential_(generator=g)
    return first_max(probs / draws.clamp_min(1e-10))


BLOCK_ROWS = 8  # rows from which first_max searches blocks on a CPU (one row: max is faster)


@functools.cache
def block_width(V: int) -> int | None:
    """The width of the blocks :func:`first_max` splits a row of V scores into: the widest
    multiple of 16 (AVX-512's floats) from 64 to 512 that divides V into 4 blocks or more;
    None where there is none (V = 50,257, say, or a character vocabulary)."""
    return next((w for w in range(512, 63, -16) if V % w == 0 and V // w >= 4), None)


def first_max(x: Tensor) -> Tensor:
    """``x.argmax(-1)`` of x (N, V): the index of each row's largest entry, the first of ties
    (and of NaNs). ``max`` and ``argmax`` walk a row one number at a time, keeping its index;
    ``amax`` (no index) runs at the vector units' speed. So on a CPU, for many rows, each row
    is cut into blocks of :func:`block_width`: the blocks' maxima by ``amax``, the first block
    holding the row's maximum by ``max`` over those few, and the index within that block by
    ``max`` over its entries. The first block that holds the maximum holds its first
    occurrence, so the index is argmax's. ``max`` (the same indices as argmax, and faster
    than it) for a few rows, on other devices, or where V has no block width. Figures:
    docs/performance.md, "The engine's choices for a CPU"."""
    if x.dim() != 2 or x.size(0) < BLOCK_ROWS or x.device.type != "cpu":
        return x.max(-1).indices
    w = block_width(x.size(-1))
    if w is None:
        return x.max(-1).indices
    N, V = x.shape
    blocks = x.reshape(N, V // w, w)
    first = blocks.amax(-1).max(-1).indices  # (N,) the first block holding each row's max
    within = blocks[torch.arange(N, device=x.device), first]  # (N, w)
    return first * w + within.max(-1).indices
