"""Batches: which examples go together, in which order, and as which tensors.

Every batch is a pure function of its global index ``i`` and the seed. Resuming a run only
needs the number of batches already consumed, and every DDP rank computes the same global
batch and keeps its own slice of it (``shard``), so the combined batch over ranks is exactly
the batch a single process would see.

* Sequence pairs and labelled texts: examples sorted by length are cut into batches whose
  padded size ``len(batch) * longest`` stays under a token budget (little padding); each epoch
  visits the batches in a fresh seeded order.
* Language modelling: ``batch_size`` windows of ``block_size + 1`` contiguous tokens, from
  offsets drawn by a generator seeded with (seed, i).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


class Batch(dict):
    """One batch: its tensors by name (``batch["src"]``), and what it holds, counted on the
    host when it is made, so that nothing has to read them back from a device:
    ``targets``, what its loss is averaged over, ``tokens``, the non-padding input tokens it
    feeds the model (for throughput), and ``unpadded``, the names of its tensors that hold
    no padding (their attention needs no padding mask)."""

    def __init__(self, tensors: dict[str, Tensor], *, targets: int, tokens: int,
                 unpadded: frozenset[str] = frozenset()) -> None:
        super().__init__(tensors)
        self.targets, self.tokens, self.unpadded = targets, tokens, unpadded

    def to(self, device: torch.device) -> Batch:
        """On ``device``: copies that do not wait for the host where the tensors are pinned
        (:meth:`pinned`)."""
        return self._with({k: v.to(device, non_blocking=True) for k, v in self.items()})

    def pinned(self) -> Batch:
        """In page-locked host memory (a GPU machine's), from which a copy to the GPU runs
        while the host goes on."""
        return self._with({k: v.pin_memory() for k, v in self.items()})

    def _with(self, tensors: dict[str, Tensor]) -> Batch:
        return Batch(tensors, targets=self.targets, tokens=self.tokens, unpadded=self.unpadded)


def token_budget_batches(lengths, max_tokens: int, min_size: int = 1) -> list[np.ndarray]:
    """Indices grouped into batches of similar length with ``len * longest <= max_tokens``.

    Examples are sorted by (length, index); a batch takes the next examples while one more
    would keep ``count * longest`` within the budget (the longest is the last added, since
    lengths only grow), and at least ``min_size`` of them (one per DDP rank). A single
    example longer than the budget gets a batch of its own (it is not dropped); a last batch
    smaller than ``min_size`` joins the one before. One binary search per batch, so millions
    of examples are planned in a second."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(lengths, kind="stable")  # ties keep index order
    ordered = lengths[order]
    n = len(order)
    bounds = [0]
    while bounds[-1] < n:
        start = bounds[-1]
        # first end e >= start + min_size with (e - start + 1) * ordered[e] > max_tokens:
        # the product only grows with e, so it is found by bisection
        end = bisect.bisect_right(range(start, n), max_tokens,
                                  key=lambda e: (e - start + 1) * ordered[e]) + start
        bounds.append(min(n, max(end, start + min_size, start + 1)))
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < min_size:
        bounds.pop(-2)  # the short last batch joins the one before
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@dataclass
class BatchPlan:
    """Global batch ``i`` -> example indices: epochs of the fixed batches in seeded order."""

    batches: list[list[int]]
    seed: int

    def __post_init__(self) -> None:
        if not self.batches:
            raise ValueError("no training batches: the training data is empty")
        self._epoch, self._order = -1, []

    def __len__(self) -> int:
        return len(self.batches)

    def indices(self, i: int) -> list[int]:
        epoch, k = divmod(i, len(self.batches))
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._order = torch.randperm(len(self.batches), generator=g, device="cpu").tolist()
            self._epoch = epoch
        return self.batches[self._order[k]]


def shard(items: list, rank: int, world: int) -> list:
    """This rank's share of a global batch: items rank, rank + world, ..."""
    return items[rank::world]


def pad(rows, pad_id: int, *, multiple: int = 0, plus: int = 0, cap: int = 0) -> Tensor:
    """Right-pad sequences of ids (lists or arrays) into a (B, L) long tensor.

    L is the longest row, or with ``multiple`` (``[data] pad_to_multiple``) the next length
    whose ``L - plus`` is a multiple of it (``plus=1`` for a target whose input is
    ``tgt[:, :-1]``) but not past ``cap``: a few distinct shapes instead of one per length,
    so that torch.compile compiles each once and GPU matmuls get aligned sizes."""
    width = max(len(r) for r in rows)
    if multiple > 1:
        rounded = -(-(width - plus) // multiple) * multiple + plus
        width = max(width, min(rounded, cap or rounded))
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return torch.from_numpy(out)


def lm_windows(tokens, i: int, seed: int, batch_size: int,
               block_size: int) -> tuple[Tensor, Tensor]:
    """Global batch ``i`` of a language model: (inputs, targets), each (batch_size, block).
    ``tokens``: the text's ids, a 1-D array (a memory map) or tensor."""
    tokens = _array(tokens)
    n = len(tokens)
    block = min(block_size, n - 1)
    if block < 1:
        raise ValueError(f"language-model data has {n} tokens; it needs at least 2")
    g = torch.Generator().manual_seed(seed * 100_003 + i)
    starts = torch.randint(0, n - block, (batch_size,), generator=g, device="cpu").numpy()
    windows = tokens[starts[:, None] + np.arange(block + 1)]  # (batch_size, block + 1)
    windows = torch.from_numpy(windows.astype(np.int64))
    return windows[:, :-1], windows[:, 1:]


def lm_eval_windows(tokens, block_size: int) -> Iterator[tuple[Tensor, Tensor]]:
    """Consecutive non-overlapping windows covering the whole validation text once, made as
    they are asked for (a large validation text is never held as tensors at once)."""
    tokens = _array(tokens)
    for start in range(0, len(tokens) - 1, block_size):
        chunk = torch.from_numpy(tokens[start: start + block_size + 1].astype(np.int64))
        if chunk.numel() >= 2:
            yield chunk[None, :-1], chunk[None, 1:]


def _array(tokens) -> np.ndarray:
    return tokens.numpy() if isinstance(tokens, Tensor) else tokens


class BucketBatches:
    """Examples of varied length (pairs, labelled texts) batched under a token budget:
    ``micro_batch(i)`` is this rank's share of global batch ``i``, collated into tensors by the
    task's ``collate``; ``valid_batches()`` covers the validation examples once."""

    def __init__(self, train, valid, *, lengths: Callable[[object], np.ndarray],
                 collate: Callable[[list], Batch], max_tokens: int, seed: int, rank: int = 0,
                 world: int = 1) -> None:
        self.train, self.valid, self.collate = train, valid, collate
        self.rank, self.world = rank, world
        self.plan = BatchPlan(token_budget_batches(lengths(train), max_tokens, world), seed)
        self.valid_plan = token_budget_batches(lengths(valid), max_tokens)

    def micro_batch(self, i: int) -> Batch:
        share = shard(self.plan.indices(i), self.rank, self.world)
        return self.collate([self.train[j] for j in share])

    def valid_batches(self) -> Iterator[Batch]:
        for indices in self.valid_plan:
            yield self.collate([self.valid[j] for j in indices])


class WindowBatches:
    """A language model's batches: ``batch_size`` random windows of one long token tensor per
    global batch (this rank keeps its share); validation reads the text once, in order."""

    def __init__(self, train, valid, *, batch_size: int, block_size: int,
                 seed: int, rank: int = 0, world: int = 1) -> None:
        self.train, self.valid = train, valid
        self.batch_size, self.block_size, self.seed = batch_size, block_size, seed
        self.rank, self.world = rank, world

    def micro_batch(self, i: int) -> Batch:
        x, y = lm_windows(self.train, i, self.seed, self.batch_size, self.block_size)
        return text_batch(shard(x, self.rank, self.world), shard(y, self.rank, self.world))

    def valid_batches(self) -> Iterator[Batch]:
        windows = lm_eval_windows(self.valid, self.block_size)
        while group := list(itertools.islice(windows, self.batch_size)):
            width = group[0][0].size(1)  # the last window may be shorter: its own batch
            for chunk in ([w for w in group if w[0].size(1) == width],
                          [w for w in group if w[0].size(1) != width]):
                if chunk:
                    yield text_batch(torch.cat([x for x, _ in chunk]),
                                     torch.cat([y for _, y in chunk]))


def text_batch(inputs: Tensor, targets: Tensor) -> Batch:
    """Windows of text (no padding): every input token is read, every target predicted."""
    return Batch({"input": inputs, "target": targets}, targets=targets.numel(),
                 tokens=inputs.numel())
