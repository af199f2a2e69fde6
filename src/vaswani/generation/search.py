"""Greedy search, sampling and beam search over a stepper (see steppers.py).

All three never produce ``<pad>`` or ``<bos>``, stop a sequence at its first ``<eos>``, and
stop it at its own length limit otherwise.

Beam search scores a hypothesis by the GNMT length-normalised log-probability (Wu et al.
2016, eq. 14): ``log P(y) / lp(y)`` with ``lp(y) = ((5 + |y|) / 6) ** alpha``, where |y| counts
the generated tokens including ``<eos>``; ``alpha = 0`` is the raw log-probability.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..config.sections import check_beam
from .rules import Rules

NO_RULES = Rules()


def _blocked(logits: Tensor, blocked: tuple[int, ...]) -> Tensor:
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)
    logits[:, list(blocked)] = float("-inf")
    return logits


def _strip(rows: list[list[int]], eos_id: int, pad_id: int) -> list[list[int]]:
    out = []
    for row in rows:
        ids = []
        for i in row:
            if i in (eos_id, pad_id):
                break
            ids.append(i)
        out.append(ids)
    return out


def sample_next(logits: Tensor, *, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
    """Pick one token per row from logits (N, V). ``temperature == 0`` is argmax; ``top_k``
    keeps the k likeliest tokens; ``top_p`` keeps the smallest set whose probability reaches p
    (the likeliest token always stays)."""
    if temperature == 0 or top_k == 1:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs  # probability of the tokens ranked above
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@torch.inference_mode()
def decode_loop(stepper, tokens: Tensor, limits: Tensor, choose: Callable[[Tensor], Tensor], *,
                eos_id: int, pad_id: int, bos_id: int,
                on_step: Callable[[Tensor], Tensor | None] | None = None,
                rules: Rules = NO_RULES, history_start: int = 0) -> list[list[int]]:
    """Extend ``tokens`` (N, T0) one token at a time with ``choose(logits) -> (N,)`` until
    every row has produced ``<eos>`` or ``limits[i]`` new tokens. Returns the new tokens of
    each row (without ``<eos>``). ``on_step`` sees each step's chosen tokens (for streaming)
    and may return a (N,) bool tensor of rows to end now (a stop string, a client gone).
    ``rules`` (rules.py) see ``tokens[:, history_start:]`` as the sequence.
    """
    n_prefix = tokens.size(1)
    done = torch.zeros(tokens.size(0), dtype=torch.bool, device=tokens.device)
    for t in range(int(limits.max()) if limits.numel() else 0):
        logits = _blocked(stepper.logits(tokens), (pad_id, bos_id))
        logits = rules.apply(logits, tokens[:, history_start:], tokens[:, n_prefix:],
                             eos_id=eos_id, pad_id=pad_id)
        next_id = choose(logits).masked_fill(done, pad_id)
        tokens = torch.cat([tokens, next_id[:, None]], dim=1)
        ended = on_step(next_id) if on_step is not None else None
        done |= (next_id == eos_id) | (t + 1 >= limits)
        if ended is not None:
            done |= ended
        if bool(done.all()):
            break
    return _strip(tokens[:, n_prefix:].tolist(), eos_id, pad_id)


def length_penalty(length: int, alpha: float) -> float:
    """GNMT: ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.inference_mode()
def beam_search(stepper, n_sentences: int, limits: Tensor, *, beam: int, bos_id: int,
                eos_id: int, pad_id: int, alpha: float = 0.0, n_best: int = 1,
                rules: Rules = NO_RULES) -> list[list[tuple[list[int], float]]]:
    """Beam search over ``n_sentences`` at once; returns, per sentence, the ``n_best`` best
    finished hypotheses as (token ids without <eos>, normalised score), best first.

    Each step expands every live hypothesis by every token and keeps the 2K best candidates
    per sentence: those ending in ``<eos>`` among the top K are finished (and kept), the best
    K others continue. A hypothesis reaching its sentence's limit is finished as it is. A
    sentence is done when it has K finished hypotheses and no live one can still beat the
    worst of them: log-probabilities only fall as a hypothesis grows, and with alpha >= 0 the
    best it can reach is its score now divided by lp(limit). Sentences never affect one
    another, so the output does not depend on what else is in the batch. ``rules`` (rules.py)
    adjust the log-probabilities; they keep them <= 0 (so the bound holds) unless a presence or
    frequency penalty is negative, and then a sentence runs to its limit.
    """
    check_beam(beam, n_best, alpha)
    B, K = n_sentences, beam
    device = limits.device
    bounded = rules.presence_penalty >= 0 and rules.frequency_penalty >= 0
    stepper.reorder(torch.arange(B, device=device).repeat_interleave(K))  # (B*K) rows
    tokens = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
    scores = torch.full((B, K), float("-inf"), dtype=torch.float64, device=device)
    scores[:, 0] = 0.0  # one live hypothesis per sentence at the start
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    done = [False] * B
    for t in range(int(limits.max())):
        length = t + 1  # tokens each candidate will have generated
        logp = _blocked(stepper.logits(tokens), (pad_id, bos_id)).log_softmax(-1)  # (B*K, V)
        logp = rules.apply(logp, tokens[:, 1:], tokens[:, 1:], eos_id=eos_id, pad_id=pad_id)
        V = logp.size(-1)
        candidates = (scores.reshape(B * K, 1) + logp).view(B, K * V)
        top_scores, top_index = candidates.topk(min(2 * K, K * V), dim=1)  # (B, 2K)
        top_scores, top_index = top_scores.tolist(), top_index.tolist()
        rows, next_tokens, next_scores = [], [], []
        for b in range(B):
            alive: list[tuple[int, int, float]] = []  # (row, token, raw score)
            if not done[b]:
                limit = int(limits[b])
                for rank, (s, idx) in enumerate(zip(top_scores[b], top_index[b], strict=True)):
                    if s == float("-inf") or len(alive) == K:
                        break
                    row, token = b * K + idx // V, idx % V
                    if token == eos_id or length >= limit:
                        if rank < K:
                            ids = tokens[row, 1:].tolist() + ([] if token == eos_id else [token])
                            finished[b].append((s / length_penalty(length, alpha), ids))
                    else:
                        alive.append((row, token, s))
                finished[b].sort(key=lambda h: -h[0])
                if length >= limit or not alive:
                    done[b] = True
                elif len(finished[b]) >= K and bounded:
                    bound = alive[0][2] / length_penalty(limit, alpha)
                    done[b] = finished[b][K - 1][0] >= bound
            if done[b]:
                alive = []
            while len(alive) < K:  # keep the batch rectangular with dead rows
                alive.append((b * K, pad_id, float("-inf")))
            for row, token, s in alive:
                rows.append(row)
                next_tokens.append(token)
                next_scores.append(s)
        if all(done):
            break
        row_index = torch.tensor(rows, device=device)
        stepper.reorder(row_index)
        tokens = torch.cat([tokens.index_select(0, row_index),
                            torch.tensor(next_tokens, device=device)[:, None]], dim=1)
        scores = torch.tensor(next_scores, dtype=torch.float64, device=device).view(B, K)
    return [[(ids, score) for score, ids in hyps[:n_best]] for hyps in finished]
