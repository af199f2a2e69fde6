"""The engine's key/value cache: one slot per running row, preallocated, written in place and
read in place.

Why slots rather than paged blocks (docs/architecture.md): on a CPU attention is bound by
memory traffic, and a paged cache must first gather each row's blocks into one tensor for
SDPA, every layer of every step (which costs more than the attention itself). Here
row i of the running batch lives in slot i, so a decode step's keys are a *view* of the cache,
``k[:R, :, :Tk]``, that SDPA reads where it lies; nothing is copied per step.

Layout, per decoder layer: keys and values of shape (rows, Hkv, width, Dh), and for a
translator the source's keys and values for cross-attention, (rows, Hkv, cross_width, Dh),
in *source slots*: one per request, which all its rows read. The running rows hold slots
``0 .. used - 1`` and the requests' sources source slots ``0 .. sources_used - 1``, both kept
compact: when a row (a source) leaves, the last one moves into the hole (one batched copy a
step). A beam search's hypotheses are rows of their request; a hypothesis that forks copies
its parent's slot (as CTranslate2 reorders its cache), never the source. The last column of
a slot is scratch: padding queries write there and nothing reads it.

Cross-attention over one copy of a source: the K hypotheses of a beam search are grouped as
K queries of their source slot (views.py :class:`SlotKV` ``queries`` / ``outputs``), so a step reads
each source once, not once per hypothesis (on a CPU, where attention is bound by memory
traffic, that is most of a beam step's cross-attention time).

Memory follows the work, never ``max_len``: the cache may hold ``tokens`` token positions in
all (its budget), and holds what the running rows need of them: slots are as wide as the
longest running context needs (from ``START_WIDTH``, grown by doubling, up to ``max_len +
1``), and the tensors have as many slots as are in use (grown by doubling, up to what the
budget holds at that width; back to the start when the engine is idle). A model that claims a
context of 131,072 tokens costs nothing until a row is that long; a row longer than the
budget holds fails with an error that says so. When a growing row needs more than the budget
holds, the scheduler preempts the youngest request (to be recomputed later) rather than refuse
work.

Shapes: R rows of a forward pass, T new tokens, Tk keys, Hkv key/value heads, Dh head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .memory import zeros_in_huge_pages
from .plan import StepPlan
from .tensors import tensor_of
from .views import StepCache, flat_index

ALIGN = 16  # slot widths are multiples of this many tokens
START_WIDTH = 512  # slots start at most this wide
PART = 32  # rows (source slots) per part of a decoding step's attention (parts)
SLICED_FORKS = 2  # forks up to which a step copies slices, not one gather (SlotCache.fork)


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def parts(lengths: list[int]) -> list[tuple[int, int, int]] | None:
    """How a decoding step's attention reads rows 0 .. len(lengths) - 1 whose keys are
    ``lengths`` long: in parts ``(a, b, w)`` of ``PART`` consecutive rows, each over its own
    longest row's ``w`` keys (not rounded up), neighbours of one width merged,
    rather than every row over the longest's. None: one pass, where parts would not save a
    quarter of the keys read. Rows in order of length gain the most: translate and
    generate_many hand in their longest first, and compaction keeps the order."""
    longest = max(lengths)
    found: list[tuple[int, int, int]] = []
    for a in range(0, len(lengths), PART):
        b = min(len(lengths), a + PART)
        w = max(lengths[a:b])
        if found and found[-1][2] == w:
            found[-1] = (found[-1][0], b, w)
        else:
            found.append((a, b, w))
    read = sum((b - a) * w for a, b, w in found)
    return found if len(found) > 1 and 4 * read <= 3 * len(lengths) * longest else None


def _moves(owners: list, live: int) -> list[tuple[int, int]]:
    """(hole, slot) pairs that make slots 0 .. live - 1 the held ones again: each of the
    last held slots moves into a hole before it. None where no slot was let go since the
    last compaction (``live`` held slots, as many as the list has): most steps, and every
    slot taken, ask, and a scan of each slot would cost them more than their work."""
    if len(owners) == live:
        return []
    holes = [i for i in range(live) if owners[i] is None]
    tail = [j for j in range(live, len(owners)) if owners[j] is not None]
    return list(zip(holes, tail, strict=True))


class SlotCache:
    """The preallocated tensors and which row holds which slot.

    ``owners[i]`` is the row (a request's Sequence, or a placeholder holding a slot a beam
    search will fork into) in slot i and ``requests[i]`` its request; ``holders[j]`` the
    request whose source is in source slot j (``request.source_slot``), ``lengths[j]`` that
    source's length (translation)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, *, tokens: int,
                 max_rows: int, max_len: int, seq2seq: bool, dtype: torch.dtype,
                 device: torch.device, compute: torch.dtype | None = None) -> None:
        self.n_layers, self.shape = n_layers, (n_kv_heads, head_dim)
        self.max_rows, self.seq2seq = max_rows, seq2seq
        self.max_width = aligned(max_len + 1)  # every position, and the scratch column
        self.max_cross = aligned(max_len) if seq2seq else 0
        self.tokens = tokens  # the budget: a row (and source) past it fails (scheduler.py)
        self.dtype, self.device = dtype, device  # what the keys are kept in ...
        self.compute = compute or dtype  # ... and what the attention reads them as (config.py)
        self.owners: list = []  # the rows in slots 0, 1, ...; None: a hole
        self.requests: list = []  # their requests
        self.holders: list = []  # the requests whose sources are in source slots 0, 1, ...
        self.lengths: list[int] = []  # those sources' lengths
        self.used = 0  # slots held
        self.sources_used = 0  # source slots held
        self.resizes = 0  # how many times the tensors were made (CUDA graphs read them)
        self.width = self.cross_width = 0
        self.allocated = 0  # slots the tensors have (and source slots, as many)
        self.reserved = 0  # slots an offline run asked for at once (reserve) ...
        self.reserved_widths: tuple[int, int] | None = None  # ... and the widths it needs
        self.k: list[Tensor] = []  # per layer; then values, the sources' keys and values
        self.v, self.ck, self.cv = [], [], []
        self.resize(*self.initial)

    @property
    def initial(self) -> tuple[int, int]:
        """The slot widths to start at: as wide as ``max_rows`` slots can be in the budget (a
        translator's shared between target and source), at most ``START_WIDTH`` and
        full-length (grown when a row needs more; back to these when the engine is idle)."""
        per = self.tokens // self.max_rows // (2 if self.seq2seq else 1)
        width = max(ALIGN, min(per, START_WIDTH) // ALIGN * ALIGN)
        return min(width, self.max_width), min(width, self.max_cross)

    @property
    def start_widths(self) -> tuple[int, int]:
        """The widths an idle cache goes back to: those an offline run reserved, while it
        runs; else the initial ones."""
        return self.reserved_widths or self.initial

    @property
    def at_start(self) -> bool:
        """Whether the tensors are as they were made (the initial widths, one slot), or as an
        offline run reserved them."""
        return (self.width, self.cross_width) == self.start_widths and \
            self.allocated <= max(1, self.reserved)

    def restart(self) -> None:
        """Idle (no slot held): back to the start's widths, and to one slot or as many as an
        offline run has just reserved (made once, not doubled up to them again)."""
        assert self.used == 0 and self.sources_used == 0
        self.allocated = 0
        self.resize(*self.start_widths, max(1, self.reserved))

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

    def resize(self, width: int, cross_width: int, rows: int | None = None) -> None:
        """Make the tensors for ``rows`` slots this wide (default: as many as now, within
        what the budget holds at this width, at least one), keeping what the used slots hold
        (every used slot must fit: the scheduler preempts first). There are as many source
        slots as slots (a request holds at least one of each)."""
        self.compact()
        most = self.rows_at(width, cross_width)
        rows = min(most, max(1, self.used, self.allocated if rows is None else rows))
        assert self.used <= rows, (self.used, rows)

        def remake(old: list[Tensor], w: int, used: int, keep: int) -> list[Tensor]:
            out = []
            for i in range(self.n_layers):
                new = zeros_in_huge_pages((rows, self.shape[0], w, self.shape[1]),
                                          self.dtype, self.device)  # memory.py
                if old:
                    new[:used, :, :keep] = old[i][:used, :, :keep]
                    old[i] = None  # one layer's old tensor alive at a time
                out.append(new)
            return out

        keep = min(width, self.width)
        self.k = remake(self.k, width, self.used, keep)
        self.v = remake(self.v, width, self.used, keep)
        if self.seq2seq:
            keep = min(cross_width, self.cross_width)
            self.ck = remake(self.ck, cross_width, self.sources_used, keep)
            self.cv = remake(self.cv, cross_width, self.sources_used, keep)
        self.width, self.cross_width, self.allocated = width, cross_width, rows
        self.resizes += 1

    def reserve(self, slots: int, context: int = 0, source: int = 0) -> None:
        """Room for ``slots`` slots at once (as many as the budget holds at these widths): an
        offline call that knows its rows makes its tensors once rather than by doubling, each
        remake being faulted in and zeroed anew (in huge pages, which the kernel may compact
        memory to find: the larger part of a small translator's call on some machines). Held
        until :meth:`release`: an idle cache is not narrowed back meanwhile.

        ``context`` and ``source``: the longest context and source the call's rows can reach
        (their prompts and limits). An idle cache starts the call no wider than those need
        (the initial widths are the widest the budget allows up to ``START_WIDTH``, which can
        be several times the need: 1 GB for 1,000 sentences of the bible preset's model
        capped at 64 tokens, against 0.4 GB; zeroing it was a quarter of such a call on a
        2-vCPU EPYC) and no wider than the initial widths (a row that grows past them widens
        the slots as it would have); tensors that already hold that many slots at least that
        wide are kept. Without ``context``, or while slots are held, the widths stay."""
        self.reserved_widths = None
        if context and self.used == 0 and self.sources_used == 0:
            need = tuple(map(min, self.widths_for(context, source), self.initial))
            if self.width >= need[0] and self.cross_width >= need[1] and \
                    self.allocated >= min(slots, self.rows):
                need = (self.width, self.cross_width)  # what they hold already
            self.reserved_widths = need
            if (self.width, self.cross_width) != need:
                self.resize(*need, min(slots, self.rows_at(*need)))
        self.reserved = min(slots, self.rows)
        self._room_for(self.reserved)

    def release(self) -> None:
        """The run that reserved slots has ended: idle, the cache goes back to its start."""
        self.reserved = 0
        self.reserved_widths = None

    def _room_for(self, slots: int) -> None:
        """Tensors with at least ``slots`` slots (doubling: a copy of the used ones)."""
        if slots > self.allocated:
            self.resize(self.width, self.cross_width, max(slots, 2 * self.allocated))

    # --- which row holds which slot -----------------------------------------------------
    def take(self, row, request=None) -> None:
        """Give ``row`` (of ``request``) the next slot."""
        self.compact()
        self._room_for(self.used + 1)
        row.slot = len(self.owners)
        self.owners.append(row)
        self.requests.append(request)
        self.used += 1

    def take_source(self, request, length: int) -> None:
        """Give a translation request the next source slot (``request.source_slot``), for a
        source of ``length`` tokens."""
        self.compact()
        self._room_for(self.sources_used + 1)
        request.source_slot = len(self.holders)
        self.holders.append(request)
        self.lengths.append(max(1, length))
        self.sources_used += 1

    def put(self, slot: int, row) -> None:
        """``row`` holds ``slot`` now (a beam search's child in its parent's place)."""
        row.slot = slot
        self.owners[slot] = row

    def free(self, row) -> None:
        """Let a row's slot go; the hole is filled at the next :meth:`compact`."""
        if row.slot >= 0:
            self.owners[row.slot] = self.requests[row.slot] = None
            row.slot = -1
            self.used -= 1

    def free_source(self, request) -> None:
        if request.source_slot >= 0:
            self.holders[request.source_slot] = None
            request.source_slot = -1
            self.sources_used -= 1

    def compact(self) -> None:
        """Move the last rows into the holes, so that the used slots are 0 .. used - 1 again
        (one copy of each moved slot, all layers at once), and the same for source slots."""
        moves = _moves(self.owners, self.used)
        if moves:
            holes, tail = zip(*moves, strict=True)
            self._copy([self.k, self.v], holes, tail, max(self.owners[j].cached for j in tail))
            for i, j in moves:
                self.owners[i], self.requests[i] = self.owners[j], self.requests[j]
                self.owners[i].slot = i
        del self.owners[self.used:], self.requests[self.used:]
        moves = _moves(self.holders, self.sources_used)
        if moves:
            holes, tail = zip(*moves, strict=True)
            self._copy([self.ck, self.cv], holes, tail, max(self.lengths[j] for j in tail))
            for i, j in moves:
                self.holders[i], self.lengths[i] = self.holders[j], self.lengths[j]
                self.holders[i].source_slot = i
        del self.holders[self.sources_used:], self.lengths[self.sources_used:]

    def fork(self, forks: list[tuple[int, int, int, int]]) -> None:
        """For each ``(target, parent, start, length)`` of ``forks`` (a beam search's
        hypotheses that fork; they share their source), slot ``target`` gets columns
        ``start .. length - 1`` of slot ``parent``: it holds the first ``start`` already.
        All in one gather and one write per tensor, as rows of Dh numbers (flat_index),
        rather than slot slices copied by like starts; up to ``SLICED_FORKS`` forks, none
        of whose targets is another's parent, a slice's copy each."""
        forks = [f for f in forks if f[3] > f[2]]
        if not forks:
            return
        if len(forks) <= SLICED_FORKS and not {f[0] for f in forks} & {f[1] for f in forks}:
            # a few (a sentence searched alone): a slice's copy each costs less than the
            # gather's dozen operators to make its indices
            for t in (*self.k, *self.v):
                for target, parent, start, length in forks:
                    t[target, :, start:length] = t[parent, :, start:length]
            return
        total = sum(length - start for _, _, start, length in forks)
        at = tensor_of(forks, self.device)  # (F, 4): target, parent, start, length
        counts = at[:, 3] - at[:, 2]  # column = shift + its index among all forks' columns
        shift = at[:, 2] - (counts.cumsum(0) - counts)
        at = torch.stack([at[:, 0], at[:, 1], shift], 1).repeat_interleave(
            counts, 0, output_size=total)
        columns = (at[:, 2] + torch.arange(total, device=self.device))[:, None]
        to = flat_index(at[:, 0], columns, self.shape[0], self.width).view(-1)
        of = flat_index(at[:, 1], columns, self.shape[0], self.width).view(-1)
        for t in (*self.k, *self.v):  # gathered, then written: a slot may be both
            rows = t.view(-1, self.shape[1])
            rows.index_copy_(0, to, rows.index_select(0, of))

    def _copy(self, pairs: list[list[Tensor]], targets, sources, length: int) -> None:
        """Slots ``targets`` of the tensors ``pairs`` (keys, values) get the first ``length``
        columns of slots ``sources`` (past a row's context or source: never attended to)."""
        to, of = tensor_of(targets, self.device), tensor_of(sources, self.device)
        for tensors in pairs:  # the sources gathered first, then written: slots may be both
            for t in tensors:
                view = t[:, :, :length]  # index_select + index_copy_: faster than
                view.index_copy_(0, to, view.index_select(0, of))  # t[to] = t[of]

    @property
    def bytes_per_token(self) -> int:
        """The bytes of one position's keys and values, every layer's."""
        return 2 * self.n_layers * self.shape[0] * self.shape[1] * self.dtype.itemsize

    def read(self, slot: int, start: int, end: int) -> tuple[Tensor, Tensor]:
        """A copy of the keys and values of columns ``start .. end - 1`` of ``slot``, every
        layer's: (layers, Hkv, end - start, Dh) each (prefixes.py keeps them)."""
        return (torch.stack([t[slot, :, start:end] for t in self.k]),
                torch.stack([t[slot, :, start:end] for t in self.v]))

    def write(self, slot: int, start: int, k: Tensor, v: Tensor) -> None:
        """Keys and values as :meth:`read` gives them into ``slot`` from column ``start``."""
        end = start + k.size(2)
        for i in range(self.n_layers):
            self.k[i][slot, :, start:end] = k[i]
            self.v[i][slot, :, start:end] = v[i]

    def held(self, n: int) -> list[int]:
        """The source slot of each row in slots 0 .. n - 1 (a translator's)."""
        return [self.requests[i].source_slot for i in range(n)]

    def groups(self, n: int) -> tuple[Tensor, Tensor] | None:
        """How the rows in slots 0 .. n - 1 read their sources in a decode step: None when
        row i's source is source slot i (each request one row, as slots and source slots are
        compacted alike), else (members, place) for :class:`SlotKV`: the rows of source
        slot g are ``members[g]`` (G, K), padded with row 0, and row i is query
        ``place[i]`` of the grouped queries (G * K)."""
        held = self.held(n)
        if held == list(range(n)):
            return None
        members: list[list[int]] = [[] for _ in range(self.sources_used)]
        for i, g in enumerate(held):
            members[g].append(i)
        K = max(len(m) for m in members)
        place = [0] * n
        for g, rows in enumerate(members):
            for j, i in enumerate(rows):
                place[i] = g * K + j
        grid = [m + [0] * (K - len(m)) for m in members]
        return tensor_of(grid, self.device), tensor_of(place, self.device)

    def parts(self) -> list[tuple[int, int, int]] | None:
        """How a decoding step's cross-attention reads the used source slots in place
        (:func:`parts`, each source over its own length)."""
        return parts(self.lengths[:self.sources_used])

    # --- one forward pass ---------------------------------------------------------------
    def step(self, plan: StepPlan) -> StepCache:
        """The cache as one forward pass sees it, laid out as ``plan`` says (plan.py)."""
        return StepCache(self, plan)
