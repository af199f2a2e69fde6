"""Beam search in the engine: ranking the candidates of many searches at once, and giving
each search's new hypotheses their cache slots.

A request that searches with a beam of K holds K slots (cache.py), one per live hypothesis
(a :class:`~.request.Sequence`), and generation/search.py's ``Beam`` decides, step by step,
which hypotheses live on. Here:

* :func:`search`: a step of every beam search due, given their rows' logits;
* :func:`rank`: every due search's best candidates, ranked in one pass over all their rows;
* :func:`place`: a search's children into its slots. The first child of a hypothesis takes
  its parent's slot over (its keys are already there); another child takes a slot no child
  holds, the one that already holds the longest prefix of its parent's keys (:func:`shared`),
  and is queued for a copy of the rest (cache.py ``SlotCache.fork``), as CTranslate2 reorders
  its cache after a step, but copying only where the hypotheses differ.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from .cache import SlotCache
from .request import Request, Sequence
from .sampler import Row, Sampler, rows_of
from .tensors import tensor_of


def search_rows(rows: list[Row], logits: Tensor, at: list[int], sampler: Sampler,
                cache: SlotCache) -> tuple[list[Request], int]:
    """:func:`search` for the beam searches among a step's due ``rows`` (row i's logits
    ``logits[at[i]]``), their copies made; returns the searches done and the rows searched."""
    searches: dict[int, list[int]] = {}  # a beam search's rows, in its hypotheses' order
    for i, (r, _) in enumerate(rows):
        if r.beam is not None:
            searches.setdefault(r.id, []).append(i)
    if not searches:
        return [], 0
    order = [i for index in searches.values() for i in index]
    done, forks = search([[rows[i] for i in index] for index in searches.values()], logits,
                         [at[i] for i in order], sampler, cache)
    if forks:  # every search's copies at once
        cache.fork(forks)
    return done, len(order)


def search(searches: list[list[Row]], logits: Tensor, at: list[int], sampler: Sampler,
           cache: SlotCache) -> tuple[list[Request], list[tuple[int, int, int, int]]]:
    """A step of every beam search due (their rows search after search, row i's logits
    ``logits[at[i]]``): their candidates scored and ranked together (one log-softmax and
    one top-k for all the logits, whatever their order: :func:`rank`), then each search's
    generation/search.py ``Beam`` picks its finished and live hypotheses, and :func:`place`
    gives the live ones their slots. Returns the searches that are done, and the copies the
    live hypotheses need (``forks``, for cache.py ``SlotCache.fork``)."""
    if 2 * len(at) < logits.size(0):  # a few searches among many rows: theirs alone
        logits, at = rows_of(logits, at), list(range(len(at)))
    logp = sampler.scores([row for rows in searches for row in rows], logits, log=True, at=at)
    V = logp.size(-1)
    ranked = rank([len(rows) for rows in searches], [rows[0][0].beam.K for rows in searches],
                  [s.score for rows in searches for _, s in rows], logp, at)
    done: list[Request] = []
    forks: list[tuple[int, int, int, int]] = []
    for rows, (top_scores, top_index) in zip(searches, ranked, strict=True):
        request = rows[0][0]
        n = request.beam.candidates(len(rows) * V)
        histories = [s.tokens[len(request.start):] for _, s in rows]
        alive = request.beam.advance(len(histories[0]) + 1, top_scores[:n], top_index[:n], V,
                                     histories)
        request.first_token = request.first_token or time.perf_counter()
        if request.beam.done:
            done.append(request)
        else:
            place(cache, request, [s for _, s in rows], alive, forks)
    return done, forks


def rank(sizes: list[int], beams: list[int], scores: list[float], logp: Tensor,
         at: list[int]) -> list[tuple[list[float], list[int]]]:
    """The best candidates of each search, best first: searches of ``sizes[i]`` live rows
    and beam ``beams[i]``, whose rows (search after search) have the raw scores ``scores``
    and next-token log-probabilities ``logp[at[j]]`` (N, V) -> per search (candidate
    scores, candidate indices ``row * V + token``), as ``Beam.advance`` takes them.

    A search's best candidates are among each of its rows' best 2 * beam tokens: those are
    ranked, not every (row, token), in float64 as ``Beam`` does, for all searches in one
    top-k over a (searches, K * m) grid (shorter searches padded with -inf)."""
    V = logp.size(-1)
    device = logp.device
    m = min(2 * max(beams), V)
    best, tokens = top_k(logp, m)  # (N, m)
    if len(at) != logp.size(0) or at != list(range(len(at))):  # not every row, in order
        index = tensor_of(at, device)
        best, tokens = best.index_select(0, index), tokens.index_select(0, index)
    S, K = len(sizes), max(sizes)  # searches, rows per search
    candidates = tensor_of(scores, device, torch.float64)[:, None] + best
    ids = tokens
    if min(sizes) < K:  # (a search of fewer rows: its grid padded, as rows of -inf)
        rows = tensor_of([i * K + j for i, n in enumerate(sizes) for j in range(n)], device)
        candidates = torch.full((S * K, m), float("-inf"), dtype=torch.float64,
                                device=device).index_copy_(0, rows, candidates)
        ids = torch.zeros((S * K, m), dtype=torch.long, device=device).index_copy_(0, rows, ids)
    top = candidates.view(S, K * m).topk(min(m, K * m))
    token = ids.view(S, K * m).gather(1, top.indices)
    index = top.indices // m * V + token  # Beam's candidate index: row * V + token
    return list(zip(top.values.tolist(), index.tolist(), strict=True))


def top_k(x: Tensor, k: int, groups: int = 8) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=-1)`` of a wide x (N, V), found among ``groups * k`` entries per row.
    Seen as (N, groups, V / groups), column j of a row holds entries j, j + V / groups, ...;
    a column whose largest entry is not among the row's k largest column maxima holds none
    of its k largest entries (k other columns each hold a larger one). So one pass of
    maxima over columns, a top-k of those, and a top-k of the chosen columns' entries:
    faster than ``topk`` over whole rows (docs/performance.md, "The engine's choices for a
    CPU"). Plain ``topk`` where V is not a multiple of ``groups`` or too narrow to gain."""
    N, V = x.shape
    if V % groups or 4 * groups * k > V:
        return x.topk(k, dim=-1)
    width = V // groups
    columns = x.view(N, groups, width).amax(1).topk(k, dim=-1).indices  # (N, k)
    offsets = torch.arange(0, V, width, device=x.device)  # (groups,)
    index = (columns[:, None, :] + offsets[:, None]).view(N, groups * k)
    values, at = x.gather(1, index).topk(k, dim=-1)
    return values, index.gather(1, at)


def place(cache: SlotCache, request: Request, parents: list[Sequence],
          alive: list[tuple[int, int, float]], forks: list[tuple[int, int, int, int]]
          ) -> None:
    """A search's live hypotheses after a step, ``alive`` (parent's row, token, score) from
    ``Beam.advance``, into the request's slots; the copies they need are queued in ``forks``
    as (slot, parent's slot, keys the slot holds already, keys to copy)."""
    children: list[Sequence] = []
    homes: dict[int, int] = {}  # parent's row -> the slot of its keys (its first child's)
    orphans = []  # (child, parent's row): children whose parent's slot a sibling took
    for row, token, score in alive:
        child = Sequence(parents[row].tokens + [token], score)
        child.cached = parents[row].cached
        if row in homes:
            orphans.append((child, row))
        else:
            homes[row] = parents[row].slot
            cache.put(parents[row].slot, child)
        children.append(child)
    # the rows whose slots are free now, and what those slots hold: a parent without a
    # child, a spare (a slot kept for later children)
    free = [p for row, p in enumerate(parents) if row not in homes] + request.spares
    held: dict[int, list[int]] = {}  # parent's row -> keys each free slot holds of it
    for child, row in orphans:  # (siblings are mostly one parent's: computed once)
        if row not in held:
            held[row] = [0 if request.recomputed else shared(f, parents[row]) for f in free]
        best = held[row].index(max(held[row]))
        start = held[row][best]
        for keys in held.values():
            del keys[best]
        slot = free.pop(best).slot
        cache.put(slot, child)
        forks.append((slot, homes[row], start, parents[row].cached))
    request.spares = free  # slots kept for later children, as they are: a parent without
    # a child still holds its slot and says what it holds
    request.sequences = children


def shared(a: Sequence, b: Sequence) -> int:
    """How many leading keys the slots of rows ``a`` and ``b`` (hypotheses of one beam search)
    hold alike: their tokens' common prefix, within what each has cached. A hypothesis' keys
    at a position were computed once, for the one hypothesis that then held that prefix,
    and copied when it forked, so two slots that hold one prefix hold it bit for bit (unless
    the rows were computed again one by one: ``Request.recomputed``). Beam hypotheses
    mostly differ in their last few tokens: a fork then copies those, not the whole row."""
    n = min(a.cached, b.cached)
    if a.offset != b.offset or n == 0:
        return 0
    x, y = a.tokens[a.offset:a.offset + n], b.tokens[b.offset:b.offset + n]
    if x == y:
        return n
    # x[:lo] == y[:lo] and x[:hi + 1] != y[:hi + 1]: step back from the end by 1, 2, 4, ...
    # (hypotheses mostly part a few tokens back), then bisect on slices
    lo, hi, back = 0, n - 1, 1
    while back < n:
        if x[:n - back] == y[:n - back]:
            lo = n - back
            break
        hi, back = n - back - 1, 2 * back
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if x[:mid] == y[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
