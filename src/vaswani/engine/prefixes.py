"""Prefix caching: the keys and values of a prompt's leading tokens, kept after the request
that computed them, so that a later request whose prompt starts with the same tokens (a
system prompt, the earlier turns of a chat) copies them into its slot and prefills only the
rest. The outputs are those of prefilling the whole prompt: a position's keys and values
depend on the tokens up to it and nothing after.

Blocks. A prompt is read in blocks of ``BLOCK`` tokens, each named by a hash of its tokens
and of the name of the block before it (a chain: one name stands for the whole prefix up to
its block's end), rooted in the LoRA adapter the request uses and in whether its prompt is
widened (request.py ``Request.wide``; their keys differ). Whole blocks are kept and found;
and a finished request's last, partial block as a *tail* (named by its tokens after the
last whole block's name), so that a chat's next turn recomputes only its new tokens, not up
to a block of the last answer (a widened prompt keeps its prompt only: the next turn
computes the answer widened, as the prompt it is then). A request always computes at least
its last prompt token (its logits give the first new token).

Segments. What is kept is a tree of *segments*: a segment holds the keys and values of
positions ``start .. end - 1`` of one sequence, and its parent the positions before
``start`` (the parent may go on past ``start``: the sequences part there). A request that
finishes keeps its whole context (prompt and output: the next turn of a chat starts with
them), a request whose prompt is in keeps its prompt; each stores only the blocks not kept
yet, so sixteen requests that share a 1,000-token system prompt hold it once, each
continuation a short segment below it. Finding a prefix is a walk along its block names;
loading it, one copy per layer per segment on the way back to the root.

Memory: at most ``budget`` bytes; when a new segment would pass it, the least recently used
segments with no children are dropped first (a parent stays while a child needs it).

Concurrent requests. Requests that arrive together would all compute the prefix they share
before any of them has kept it; so a waiting request whose prompt shares more blocks with a
request still prefilling than the cache holds waits for it (the scheduler admits others
meanwhile) and then starts after the shared blocks: the prefix is computed once.

Why copies, not shared blocks: the engine's cache is a slot per row read in place
(cache.py), so a request's keys must lie in its own slot; a copy costs one pass over the
prefix's bytes, far less than computing it (docs/architecture.md).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from torch import Tensor

from .request import Request

BLOCK = 16  # tokens named, kept and found together


class Segment:
    """Keys and values of positions ``start .. end - 1`` of a sequence, per layer (Hkv,
    end - start, Dh) stacked as (layers, Hkv, end - start, Dh); ``parent`` holds the
    positions before ``start``."""

    def __init__(self, parent: Segment | None, start: int, k: Tensor, v: Tensor,
                 names: dict[bytes, int]) -> None:
        self.parent, self.start, self.end = parent, start, start + k.size(2)
        self.k, self.v = k, v
        self.names = names  # the blocks (and the tail) that end in it: name -> where
        self.children = 0
        if parent is not None:
            parent.children += 1

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class PrefixCache:
    """The kept prefixes of one engine's requests, and which requests compute one now;
    ``budget`` 0: none kept (an offline engine's, a translator's)."""

    def __init__(self, cache, budget: int) -> None:
        self.cache, self.budget = cache, budget  # cache: the engine's SlotCache
        self.found: dict[bytes, tuple[Segment, int]] = {}  # a block's (a tail's) name ->
        # the segment it ends in, and where
        self.segments: OrderedDict[Segment, None] = OrderedDict()  # least recently used first
        self.bytes = 0
        self.computing: dict[Request, list[bytes]] = {}  # requests prefilling blocks not kept
        self.queried = self.hit = 0  # prompt tokens looked up, and found (as vLLM counts)

    def stats(self) -> dict:
        return {"prefix_queried_tokens": self.queried, "prefix_hit_tokens": self.hit,
                "prefix_cached_tokens": sum(s.end - s.start for s in self.segments),
                "prefix_cache_bytes": self.bytes}

    # --- names ----------------------------------------------------------------------------
    @staticmethod
    def names(request: Request, n: int) -> list[bytes]:
        """The names of the whole blocks among the first ``n`` tokens of the request's row,
        kept on the request and extended as its tokens grow (they are only ever appended)."""
        tokens, names = request.sequences[0].tokens, request.block_names
        last = names[-1] if names else _root(request)
        for a in range(len(names) * BLOCK, n - BLOCK + 1, BLOCK):
            last = _name(last, tokens[a:a + BLOCK])
            names.append(last)
        return names[:n // BLOCK]

    @staticmethod
    def _tail(request: Request, names: list[bytes], n: int) -> bytes:
        """The name of the tokens of the request's row after the whole blocks ``names``, up
        to its ``n``-th token."""
        return _name(b"tail" + (names[-1] if names else _root(request)),
                     request.sequences[0].tokens[len(names) * BLOCK:n])

    def _kept(self, names: list[bytes]) -> int:
        """How many of the leading blocks ``names`` are kept."""
        n = 0
        while n < len(names) and names[n] in self.found:
            n += 1
        return n

    @staticmethod
    def usable(request: Request) -> bool:
        """Whether a request's prefix can be kept and found: one row whose context starts at
        the first token (a slid context's positions start elsewhere)."""
        return request.beam is None and not request.seq2seq and \
            request.sequences[0].offset == 0

    # --- admission ------------------------------------------------------------------------
    def waits(self, request: Request) -> bool:
        """Whether a waiting request should wait for a request that is computing more of
        its prefix than the cache holds (see the module)."""
        if not self.computing or not self.usable(request):
            return False
        names = self.names(request, request.sequences[0].context - 1)
        kept = self._kept(names)
        for theirs in self.computing.values():
            shared = 0
            while shared < min(len(names), len(theirs)) and names[shared] == theirs[shared]:
                shared += 1
            if shared > kept:
                return True
        return False

    def load(self, request: Request) -> None:
        """A request just given its slot: copy the longest kept prefix of its context (all
        but its last token) into it, and note what it will compute beyond that."""
        if not self.usable(request):
            return
        seq = request.sequences[0]
        self.queried += seq.context
        if self.budget <= 0:
            return
        names = self.names(request, seq.context - 1)
        kept = self._kept(names)
        found = self.found[names[kept - 1]] if kept else None
        start = kept * BLOCK  # a tail after the kept blocks, the longest first
        for n in range(min(start + BLOCK - 1, seq.context - 1), start, -1):
            found = self.found.get(self._tail(request, names[:kept], n), found)
            if found is not None and found[1] == n:
                break
        if found is not None:
            segment, end = found
            self._copy_into(seq.slot, segment, end)
            seq.cached = end
            self.hit += end
        if kept < len(names):
            self.computing[request] = names

    def _copy_into(self, slot: int, segment: Segment, end: int) -> None:
        """Positions 0 .. end - 1, from ``segment`` and its ancestors, into ``slot``."""
        while segment is not None:
            n = end - segment.start
            self.cache.write(slot, segment.start, segment.k[:, :, :n], segment.v[:, :, :n])
            self.segments.move_to_end(segment)  # used: its ancestors are touched after it
            end, segment = segment.start, segment.parent

    # --- keeping --------------------------------------------------------------------------
    def keep(self, request: Request, tail: bool = False) -> None:
        """Keep the whole blocks the request's row has cached (its prompt once it is in, its
        context when it finishes) that the cache does not hold yet; with ``tail`` (it
        finished), the partial block after them too."""
        self.computing.pop(request, None)
        if not self.usable(request) or self.budget <= 0:
            return
        seq = request.sequences[0]
        # a widened prompt (Request.wide) keeps its prompt only: a later prompt holding its
        # answer computes that widened, as a prompt, and so must what it finds kept
        cached = min(seq.cached, len(request.start)) if request.wide else seq.cached
        names = self.names(request, cached)
        kept = self._kept(names)
        parent = self.found[names[kept - 1]][0] if kept else None
        if kept < len(names):
            start = kept * BLOCK
            parent = self._add(seq.slot, parent, start, {
                name: start + (i + 1) * BLOCK for i, name in enumerate(names[kept:])})
            if parent is None:
                return  # no room
        end = len(names) * BLOCK
        if tail and cached > end:
            name = self._tail(request, names, cached)
            if name not in self.found:
                self._add(seq.slot, parent, end, {name: cached})

    def _add(self, slot: int, parent: Segment | None, start: int, names: dict[bytes, int]
             ) -> Segment | None:
        """A segment of ``slot``'s columns from ``start`` to where the last of ``names``
        ends, below ``parent``; None where the budget cannot make room for it."""
        end = max(names.values())
        size = self.cache.bytes_per_token * (end - start)
        while self.bytes + size > self.budget and self._evict_one(keep=parent):
            pass
        if self.bytes + size > self.budget:
            return None
        k, v = self.cache.read(slot, start, end)
        segment = Segment(parent, start, k, v, names)
        for name, at in names.items():
            self.found[name] = (segment, at)
        self.segments[segment] = None
        self.bytes += segment.nbytes
        return segment

    def drop(self, request: Request) -> None:
        """A request that leaves without its prefix kept (preempted, failed) computes
        nothing for others."""
        self.computing.pop(request, None)

    def _evict_one(self, keep: Segment | None = None) -> bool:
        """Drop the least recently used segment no other needs (nor ``keep``, the parent of
        one about to be added); whether there was one."""
        for segment in self.segments:
            if segment.children == 0 and segment is not keep:
                break
        else:
            return False
        del self.segments[segment]
        for name in segment.names:
            if self.found.get(name, (None,))[0] is segment:
                del self.found[name]
        if segment.parent is not None:
            segment.parent.children -= 1
        self.bytes -= segment.nbytes
        return True


def _name(before: bytes, tokens: list[int]) -> bytes:
    """A name for ``tokens`` after the name ``before``."""
    return hashlib.blake2b(before + array("q", tokens).tobytes(), digest_size=16).digest()


def _root(request: Request) -> bytes:
    """The name before a request's first block: its adapter's, and whether its prompt is
    widened (their keys differ)."""
    return _name(f"adapter {request.adapter}{' wide' * request.wide}".encode(), [])
