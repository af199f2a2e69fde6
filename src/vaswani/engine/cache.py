"""The engine's key/value cache: one slot per running row, preallocated, written in place and
read in place.

Why slots rather than paged blocks (docs/architecture.md): on a CPU attention is bound by
memory traffic, and a paged cache must first gather each row's blocks into one tensor for
SDPA, every layer of every step (measured: 2.5-2.9x the time of the attention itself). Here
row i of the running batch lives in slot i, so a decode step's keys are a *view* of the cache,
``k[:R, :, :Tk]``, that SDPA reads where it lies; nothing is copied per step.

Layout, per decoder layer: keys and values of shape (rows, Hkv, width, Dh), and for a
translator the source's keys and values for cross-attention, (rows, Hkv, cross_width, Dh).
The running rows hold slots ``0 .. used - 1``, kept compact: when a row leaves, the last
row's slot moves into the hole (one batched copy a step). A beam search's hypotheses are
rows of their request; a hypothesis that forks copies its parent's slot (as CTranslate2
reorders its cache). The last column of a slot is scratch: padding queries write there and
nothing reads it.

Memory follows the rows, not ``max_len``: the cache holds ``tokens`` token positions in all;
slots are as wide as the longest running context needs (grown by doubling, up to
``max_len + 1``), so many rows of short contexts fit where full-length slots would not, and
when a growing row needs more than the cache holds, the scheduler preempts the youngest
request (to be recomputed later) rather than refuse work.

Shapes: R rows of a forward pass, T new tokens, Tk keys, Hkv key/value heads, Dh head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

ALIGN = 16  # slot widths are multiples of this many tokens


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class SlotCache:
    """The preallocated tensors and which row holds which slot.

    ``owners[i]`` is the row (a request's Sequence, or a placeholder holding a slot a beam
    search will fork into) in slot i; ``sources[i]`` its source's length (translation)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, *, tokens: int,
                 max_rows: int, max_len: int, seq2seq: bool, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.n_layers, self.shape = n_layers, (n_kv_heads, head_dim)
        self.max_rows, self.seq2seq = max_rows, seq2seq
        self.max_width = aligned(max_len + 1)  # every position, and the scratch column
        self.max_cross = aligned(max_len) if seq2seq else 0
        # at least two full rows, so that a request of max_len never waits forever
        self.tokens = max(tokens, 2 * (self.max_width + self.max_cross))
        self.dtype, self.device = dtype, device
        self.owners: list = []  # the rows in slots 0, 1, ...; None: a hole
        self.sources: list[int] = []
        self.used = 0  # slots held
        self.resizes = 0  # how many times the tensors were made (CUDA graphs read them)
        self.width = self.cross_width = 0
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        self.ck: list[Tensor] = []
        self.cv: list[Tensor] = []
        self.resize(*self.initial)

    @property
    def initial(self) -> tuple[int, int]:
        """The slot widths to start at: as wide as ``max_rows`` slots can be (a translator's
        shared between target and source), at most full-length (grown when a row needs
        more; back to these when the engine is idle)."""
        per = self.tokens // self.max_rows // (2 if self.seq2seq else 1)
        width = max(ALIGN, per // ALIGN * ALIGN)
        return min(width, self.max_width), min(width, self.max_cross)

    # --- size ---------------------------------------------------------------------------
    def rows_at(self, width: int, cross_width: int) -> int:
        """Slots the cache holds when they are this wide."""
        return min(self.max_rows, self.tokens // (width + cross_width))

    @property
    def rows(self) -> int:
        return self.rows_at(self.width, self.cross_width)

    def widths_for(self, context: int, source: int = 0) -> tuple[int, int]:
        """The slot widths a row of ``context`` tokens (and a ``source``) needs."""
        return min(self.max_width, aligned(context + 1)), min(self.max_cross, aligned(source))

    def grown(self, context: int) -> int:
        """The width to grow to for a context of ``context`` tokens: double, unless that
        leaves fewer slots than are used and the bare need does not."""
        need = self.widths_for(context)[0]
        doubled = min(self.max_width, max(need, 2 * self.width))
        return doubled if self.rows_at(doubled, self.cross_width) >= self.used else need

    def resize(self, width: int, cross_width: int) -> None:
        """Make the tensors for slots this wide, keeping what the used slots hold (every
        used slot must fit: the scheduler preempts first)."""
        self.compact()
        rows = self.rows_at(width, cross_width)
        assert self.used <= rows, (self.used, rows)

        def remake(old: list[Tensor], w: int, keep: int) -> list[Tensor]:
            out = []
            for i in range(self.n_layers):
                new = torch.zeros(rows, self.shape[0], w, self.shape[1], dtype=self.dtype,
                                  device=self.device)
                if old:
                    new[:self.used, :, :keep] = old[i][:self.used, :, :keep]
                    old[i] = None  # one layer's old tensor alive at a time
                out.append(new)
            return out

        keep = min(width, self.width)
        self.k, self.v = remake(self.k, width, keep), remake(self.v, width, keep)
        if self.seq2seq:
            keep = min(cross_width, self.cross_width)
            self.ck = remake(self.ck, cross_width, keep)
            self.cv = remake(self.cv, cross_width, keep)
        self.width, self.cross_width = width, cross_width
        self.resizes += 1

    # --- which row holds which slot -----------------------------------------------------
    def take(self, row, source: int = 0) -> None:
        self.compact()
        row.slot = len(self.owners)
        self.owners.append(row)
        self.sources.append(max(1, source))
        self.used += 1

    def put(self, slot: int, row) -> None:
        """``row`` holds ``slot`` now (a beam search's child in its parent's place)."""
        row.slot = slot
        self.owners[slot] = row

    def free(self, row) -> None:
        """Let a row's slot go; the hole is filled at the next :meth:`compact`."""
        if row.slot >= 0:
            self.owners[row.slot] = None
            row.slot = -1
            self.used -= 1

    def compact(self) -> None:
        """Move the last rows into the holes, so that the used slots are 0 .. used - 1 again
        (one copy of each moved slot, all layers at once)."""
        live = self.used  # slots 0 .. live - 1 are to hold the rows
        if live == len(self.owners):
            return
        holes = [i for i in range(live) if self.owners[i] is None]
        tail = [j for j in range(live, len(self.owners)) if self.owners[j] is not None]
        if holes:
            self._copy(holes, tail, max(self.owners[j].cached for j in tail),
                       cross=max(self.sources[j] for j in tail))
            for i, j in zip(holes, tail, strict=True):
                self.owners[i], self.sources[i] = self.owners[j], self.sources[j]
                self.owners[i].slot = i
        del self.owners[live:], self.sources[live:]

    def fork(self, targets: list[int], parents: list[int], length: int) -> None:
        """Slots ``targets`` start as copies of the first ``length`` keys and values of
        slots ``parents`` (a beam search's hypotheses that fork; their source is the same)."""
        if targets:
            self._copy(targets, parents, length)

    def _copy(self, targets: list[int], sources: list[int], length: int,
              cross: int = 0) -> None:
        """Slots ``targets`` get the first ``length`` keys and values of slots ``sources``,
        and their first ``cross`` source keys and values (what a source slot holds past its
        own source's length is never attended to)."""
        to = torch.tensor(targets, device=self.device)
        of = torch.tensor(sources, device=self.device)
        pairs = [(self.k, length), (self.v, length)]
        if self.seq2seq:
            pairs += [(self.ck, cross), (self.cv, cross)]
        for tensors, n in pairs:
            if n > 0:
                for t in tensors:
                    t[to, :, :n] = t[of, :, :n]  # the right side is gathered first

    # --- one forward pass ---------------------------------------------------------------
    def step(self, rows: Tensor | None, columns: Tensor, width: int,
             cross_width: int = 0) -> StepCache:
        """The cache as one forward pass sees it: ``rows`` (R,) the slots of its rows (None:
        the first R slots, read in place), ``columns`` (R, T) where the new tokens' keys go,
        ``width`` keys read per row (and ``cross_width`` source keys)."""
        return StepCache(self, rows, columns, width, cross_width)


class SlotKV:
    """One attention's view of the cache in one forward pass, as nn/kv_cache.py's ``KV``:
    ``append`` writes the new keys and values into their slots and returns the keys to
    attend over; a cross-attention's keys are there already (``k``, ``v``)."""

    def __init__(self, k: Tensor, v: Tensor, rows: Tensor | None, n: int, width: int,
                 write: tuple[Tensor, Tensor] | None = None) -> None:
        self.k_all, self.v_all = k, v
        self.rows, self.n, self.width, self.write = rows, n, width, write

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v (R, Hkv, T, Dh) into their (slot (R, 1), column (R, T)) places ``write``
        -> the keys and values to attend over, (R, Hkv, Tk, Dh)."""
        slots, columns = self.write
        self.k_all[slots, :, columns] = k.transpose(1, 2)  # (R, T, Hkv, Dh)
        self.v_all[slots, :, columns] = v.transpose(1, 2)
        return self.k, self.v

    def _read(self, t: Tensor) -> Tensor:
        if self.rows is None:  # the leading slots: a view, no copy
            return t[:self.n, :, :self.width]
        return t[:, :, :self.width].index_select(0, self.rows)

    @property
    def k(self) -> Tensor:
        return self._read(self.k_all)

    @property
    def v(self) -> Tensor:
        return self._read(self.v_all)


class StepCache:
    """Per decoder layer a self-attention :class:`SlotKV` (and a cross-attention one for a
    translator), as ``layers[i]`` of nn/kv_cache.py's ``KVCache``."""

    def __init__(self, cache: SlotCache, rows: Tensor | None, columns: Tensor, width: int,
                 cross_width: int) -> None:
        n = columns.size(0)
        slots = torch.arange(n, device=columns.device) if rows is None else rows
        write = (slots[:, None], columns)  # where every layer writes its new keys
        self.layers = [(SlotKV(cache.k[i], cache.v[i], rows, n, width, write),
                        SlotKV(cache.ck[i], cache.cv[i], rows, n, cross_width)
                        if cache.seq2seq else None)
                       for i in range(cache.n_layers)]
