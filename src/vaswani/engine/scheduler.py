"""Which rows run in the engine's next step, and every change of a request's state (its
status, its slots, what its rows have cached); nothing here runs a model.

Every step:

1. requests cancelled since the last step are retired (their slots freed at once);
2. every running row with exactly one token not yet cached, a generated one, is decoded (it
   feeds that token and gets its next one); a language model's row whose context would pass
   ``max_len`` slides first (its context is cut to the last half window and recomputed, as
   generation/reference.py ``LMStepper`` does);
3. waiting requests are admitted in arrival order while slots and the budget allow (in an
   offline run, ``gather``: only once enough rows are free for a group of them); a request
   whose prompt starts with a kept prefix starts after it (prefixes.py), and one that shares
   more of its prompt with a request still computing it than is kept waits for that one;
4. rows with more uncached tokens (a prompt, a slid context, a preempted request being
   recomputed) are prefilled, in chunks, under a budget of ``max_step_tokens`` tokens, the
   fewest tokens first;
5. with ``shared_chunk`` n > 0 (a server's engine): a long prefill (more tokens to go than
   one step's budget, ``max_step_tokens``, and than n) does not hold up the other rows. While
   other work is there, it runs in chunks of n tokens in steps of their own, taking turns
   with the others' steps by time, a quarter of it for the long prefill: a chunk only when
   the chunks so far have taken no more than a third of the others' steps' time
   (:meth:`Scheduler.took`). A short request beside a long prompt then takes a little longer
   than alone, not the prompt's whole prefill (docs/performance.md, "Serving"). A prompt
   that fits in a step's budget is no long prefill: it is prefilled in the next steps beside
   the others' decoding (the budget bounds what a step costs them), so eight clients' prompts
   arriving together reach their first tokens after about their prefill's time, not four
   times it;
6. with a fast lane (``fast_lane`` n > 0, a CPU's default): while requests of at most n tokens
   run among more rows of longer ones, every other step decodes only theirs.

Why the fast lane: on a CPU a decode step costs about what its rows cost, so a short request
among many long ones would take each token as slowly as they do. Decoding it in a step of its
own between the full steps cuts its time per token, at the cost of one small step per two
for the long rows while short ones run, and none while none do (docs/performance.md,
"Serving"). On a GPU a step of 32 rows costs what a step of one does, so there the lane would
only slow the long rows: it is off.

Why ``gather`` (``Engine.run`` sets it, a server's engine never does): an offline call over
more inputs than the engine has rows admits the rest as rows finish, mostly one or two a step,
and each admission is a pass of the encoder (or a prefill) of its own, for one or two inputs:
a long offline call runs hundreds of such passes. Held back until a group's rows are free,
the waiting inputs start together, one pass each group, while the running rows go on
decoding.

Slots are reserved on admission: one for each row (a beam search holds ``beam``, for the
hypotheses it will fork into) and a translation's source slot; the cache's slots are widened
(cache.py) when a row's context needs it. When widening leaves fewer slots than are in use,
the most recently admitted request is preempted: its slots are freed and it goes back to the
front of the queue, keeping its tokens, to be recomputed later. No request is dropped, and
each finishes exactly once.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .cache import SlotCache
from .prefixes import PrefixCache
from .request import Request, Sequence, Status

GATHER = 8  # an offline run admits new requests once 1/GATHER of its rows are free


@dataclass
class Plan:
    """One step's work: sources to encode, chunks to prefill, rows to decode; ``turn``:
    "long" (a long prefill's chunk alone), "others" (the rest, while one waits) or None."""

    encode: list[Request] = field(default_factory=list)
    prefill: list[tuple[Request, Sequence, int]] = field(default_factory=list)  # n tokens
    decode: list[tuple[Request, Sequence]] = field(default_factory=list)
    turn: str | None = None
    long: bool = False  # a long prefill's chunk (serve/loop.py gives such steps less time)

    def __bool__(self) -> bool:
        return bool(self.encode or self.prefill or self.decode)


class Scheduler:
    def __init__(self, cache: SlotCache, *, max_rows: int, max_step_tokens: int,
                 max_len: int, fast_lane: int = 0, shared_chunk: int = 0,
                 prefixes: PrefixCache | None = None) -> None:
        self.cache = cache
        self.prefixes = prefixes or PrefixCache(cache, 0)  # kept prompt prefixes (0: none)
        self.prefilled_tokens = 0  # tokens prefill passes computed (the kept ones are not)
        self.max_rows, self.max_step_tokens, self.max_len = max_rows, max_step_tokens, max_len
        self.fast_lane = fast_lane  # requests of at most this many tokens (0: no lane)
        self.shared_chunk = shared_chunk  # a long prefill's chunk beside other work (0: off)
        self.planned = 0.0  # when the last plan was made
        self.last_long = False  # whether it was a long prefill's chunk (sharing.py long_step)
        self.spent = {"long": 0.0, "others": 0.0}  # seconds of each turn, while both wait
        self.gather = 0  # rows that must be free before new requests join running ones
        self.lane_turn = False  # whether the last step decoded only the fast lane's rows
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in order of admission
        self.failed: list[Request] = []  # requests the cache could never hold
        self.preemptions = 0

    def add(self, request: Request) -> None:
        if not request.seq2seq and request.sequences[0].context > self.max_len:
            self.slide(request.sequences[0])  # a prompt past max_len: before anything is cached
        self.waiting.append(request)

    @property
    def rows(self) -> int:
        """Cache slots held by running requests."""
        return self.cache.used

    def plan(self) -> Plan:
        self.planned = time.perf_counter()
        plan = Plan()
        budget = self.max_step_tokens
        if not self.running and not self.cache.at_start:
            self.cache.restart()  # idle: the memory back, the slots narrow again
        for request in self.running:
            for seq in request.sequences:
                if not request.seq2seq and seq.context > self.max_len:
                    self.slide(seq)
                    request.recomputed = True
        self._widen()
        prefill: list[tuple[Request, Sequence, int]] = []  # (request, row, tokens to go)
        for request in self.running:  # decode what is ready; the others wait to prefill
            budget = self._rows_of(request, plan, prefill, budget)
        hold = self._gathering()  # decided once a step: a group is admitted whole
        for request in list(self.waiting) if not hold else []:  # admit, in arrival order
            if budget <= 0:
                break
            if self.prefixes.waits(request):  # for the prefix another request computes
                continue
            rows, (width, cross) = self._need(request)
            if rows > self.cache.rows_at(width, cross):  # even an empty cache is too small
                self.waiting.remove(request)
                self._fail(request, rows)
                continue
            width, cross = max(width, self.cache.width), max(cross, self.cache.cross_width)
            if self.rows + rows > min(self.max_rows, self.cache.rows_at(width, cross)):
                break
            if (width, cross) != (self.cache.width, self.cache.cross_width):
                self.cache.resize(width, cross)
            self.waiting.remove(request)
            self._take(request, rows)
            self.prefixes.load(request)  # a kept prefix into its slot: cached already
            self.running.append(request)
            request.status = Status.RUNNING
            if request.seq2seq:
                plan.encode.append(request)
            budget = self._rows_of(request, plan, prefill, budget)
        self._prefill(plan, prefill)
        if self.fast_lane and plan.turn != "long":
            plan.decode = self._lane(plan.decode)
        self.last_long = plan.long
        return plan

    def _prefill(self, plan: Plan, rows: list[tuple[Request, Sequence, int]]) -> None:
        """Give the step's prefill budget to ``rows``, the fewest tokens to go first; with
        ``shared_chunk``, a long prefill beside other work takes its turn by time."""
        budget = self.max_step_tokens
        long = [r for r in rows if self._long(r[2])]
        others = plan.encode or plan.decode or len(long) < len(rows)
        if long and others:  # a quarter of the time for the long ones
            plan.turn = "long" if 3 * self.spent["long"] <= self.spent["others"] else "others"
        else:
            self.spent = {"long": 0.0, "others": 0.0}  # nothing to share: turns start anew
        if plan.turn == "long":
            plan.encode, plan.decode = [], []  # the long ones' chunks, in a step of their own
            rows = [(r, s, min(n, self.shared_chunk)) for r, s, n in long]
        elif plan.turn == "others":
            rows = [r for r in rows if r not in long]
        plan.long = bool(long) and plan.turn != "others"  # a long prefill's step
        for request, seq, n in sorted(rows, key=lambda row: row[2]):
            n = min(n, budget)
            if n > 0:
                plan.prefill.append((request, seq, n))
                budget -= n

    def took(self, plan: Plan, seconds: float | None = None) -> None:
        """The step of ``plan`` has ended, ``seconds`` (default: since the plan was made)
        after it began: counted to its turn."""
        if plan.turn is not None:
            self.spent[plan.turn] += time.perf_counter() - self.planned if seconds is None \
                else seconds

    def _gathering(self) -> bool:
        """Whether to hold the waiting requests back this step (``gather``): while requests
        run and fewer rows are free than ``gather``, than the waiting ones need, or than a
        quarter of the rows the cache holds now."""
        if not (self.gather and self.running):
            return False
        room = min(self.max_rows, self.cache.rows_at(self.cache.width, self.cache.cross_width))
        need = 0
        for request in self.waiting:
            need += self._rows(request)
            if need >= self.gather:
                break
        return room - self.rows < min(self.gather, need, room // 4)

    def _lane(self, decode: list[tuple[Request, Sequence]]) -> list[tuple[Request, Sequence]]:
        """The rows to decode this step with a fast lane: those of requests of at most
        ``fast_lane`` tokens alone every other step, while they are fewer than half of the
        rows ready (more of them, or none: every row, every step)."""
        fast = [row for row in decode if row[0].limit <= self.fast_lane]
        if not fast or 2 * len(fast) >= len(decode):
            self.lane_turn = False
            return decode
        self.lane_turn = not self.lane_turn
        return fast if self.lane_turn else decode

    def _rows_of(self, request: Request, plan: Plan, prefill: list, budget: int) -> int:
        """Plan a request's rows: decode those with one token to feed, add the others to
        ``prefill`` with their tokens to go; returns the admission budget left (the tokens
        this step could still prefill; a long prefill that shares counts for one chunk)."""
        for seq in request.sequences:
            n = self._to_prefill(request, seq)
            if n:
                prefill.append((request, seq, n))
                budget -= min(self.shared_chunk if self._long(n) else n, budget)
            elif seq.pending == 1:
                plan.decode.append((request, seq))
        return budget

    def _long(self, n: int) -> bool:
        """Whether a prefill of ``n`` tokens to go is a long one, which takes turns with the
        other rows (``shared_chunk``; see the module)."""
        return bool(self.shared_chunk) and n > max(self.shared_chunk, self.max_step_tokens)

    @staticmethod
    def _to_prefill(request: Request, seq: Sequence) -> int:
        """How many of a row's uncached tokens to prefill (0 when one is left: that one is
        decoded). A beam search's rows stop one short, so that they are all decoded, and
        searched, in the same step. A language model's prompt tokens are prefilled apart
        from its generated ones, down to the last (a chunked prompt's, one after a kept
        prefix), so that each token is computed by one kind of pass whatever the schedule:
        a prompt's by a prefill, a generated one's as a decoding step (runner.py)."""
        n = seq.pending
        if request.beam is None and (prompt := request.prompt_pending(seq)):
            return prompt
        if n <= 1:
            return 0
        return n - 1 if request.beam is not None else n

    # --- a request's state: every change of its status, and of what its rows have cached ---
    def finish(self, request: Request, reason: str, error: BaseException | None = None
               ) -> bool:
        """Free a request's slots and drop it (finished, cancelled or failed: ``reason``,
        ``error``); whether it was not finished already."""
        if request.status is Status.FINISHED:
            return False
        if request.status is Status.RUNNING and reason in ("stop", "length", "cancelled"):
            self.prefixes.keep(request, tail=True)  # its context, for one going on from it
        self._free(request)
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status, request.reason = Status.FINISHED, reason
        request.error = error or request.error  # a request the cache cannot hold has its own
        request.finished = time.perf_counter()
        return True

    def cancelled(self) -> list[Request]:
        """The requests cancelled (``Request.cancel``) and not yet finished."""
        return [r for r in [*self.running, *self.waiting] if r.cancelled]

    def take_back(self) -> list[Request]:
        """Every request out (its slots freed), waiting again with nothing cached; its tokens,
        generator and beam kept, to be submitted again where it stands."""
        requests = [*self.running, *self.waiting]
        for request in requests:
            self._free(request)
            request.status, request.recomputed = Status.WAITING, True
            for seq in request.sequences:
                seq.cached = 0
        self.running.clear()
        self.waiting.clear()
        return requests

    @staticmethod
    def fed(seq: Sequence, n: int) -> None:
        """A row's next ``n`` tokens are in the cache now (a forward pass wrote them)."""
        seq.cached += n

    def prefilled(self, request: Request, seq: Sequence, n: int) -> None:
        """A prefill pass wrote a row's next ``n`` tokens; once its prompt is in, its
        prefix is kept for the requests that share it (prefixes.py)."""
        seq.cached += n
        self.prefilled_tokens += n
        if not seq.pending:
            self.prefixes.keep(request)

    # --- slots ---------------------------------------------------------------------------
    def _need(self, request: Request) -> tuple[int, tuple[int, int]]:
        """Slots a request takes (a beam search: one per hypothesis it may keep) and the
        slot widths its rows and source need (whatever the cache's widths are now)."""
        longest = max(seq.context for seq in request.sequences)
        return self._rows(request), self.cache.widths_for(longest,
                                                          len(request.prompt) * request.seq2seq)

    @staticmethod
    def _rows(request: Request) -> int:
        """Slots a request takes: one per row, a beam search one per hypothesis it may keep."""
        return max(request.params.beam if request.beam is not None else 0,
                   len(request.sequences))

    def _take(self, request: Request, rows: int) -> None:
        request.spares = [Sequence([]) for _ in range(rows - len(request.sequences))]
        for seq in [*request.sequences, *request.spares]:
            self.cache.take(seq, request)
        if request.seq2seq:
            self.cache.take_source(request, len(request.prompt))

    def _free(self, request: Request) -> None:
        self.prefixes.drop(request)  # it computes no prefix for others now
        for seq in [*request.sequences, *request.spares]:
            self.cache.free(seq)
        self.cache.free_source(request)
        request.spares = []

    def _fail(self, request: Request, rows: int) -> None:
        c = self.cache
        request.error = ValueError(
            f"the engine's cache ({c.tokens} token positions, {self.max_rows} rows at most) "
            f"cannot hold this request ({rows} rows); give the engine a larger cache_tokens "
            "or max_rows")
        self.failed.append(request)

    def _widen(self) -> None:
        """Widen the slots if a running row's context needs it, preempting the youngest
        requests while the wider slots would be fewer than the rows (a request alone and
        still too big fails)."""
        if self.cache.widths_for(self._longest())[0] <= self.cache.width:
            return
        width = self.cache.grown(self._longest())
        while self.rows > self.cache.rows_at(width, self.cache.cross_width):
            victim = self.running[-1]
            if len(self.running) == 1:
                self.running.remove(victim)
                self._free(victim)
                self._fail(victim, self._need(victim)[0])
                break
            self._preempt(victim)
        if self.running:  # the width again: with fewer rows, doubling may fit now
            self.cache.resize(self.cache.grown(self._longest()), self.cache.cross_width)

    def _longest(self) -> int:
        """The longest context of a running row."""
        return max((seq.context for r in self.running for seq in r.sequences), default=0)

    def _preempt(self, request: Request) -> None:
        """Free all of a request's slots and queue it first again: it keeps its tokens and
        is recomputed when readmitted."""
        self._free(request)
        for seq in request.sequences:
            seq.cached = 0
        request.recomputed = True
        self.running.remove(request)
        request.status = Status.WAITING
        self.waiting.appendleft(request)
        self.preemptions += 1

    def slide(self, seq: Sequence) -> None:
        """A language model's context past max_len: keep the last half window (positions
        restart), and recompute it (in the same slot)."""
        seq.offset = len(seq.tokens) - max(1, self.max_len // 2)
        seq.cached = 0


def prefill_groups(rows: list[tuple[Request, Sequence, int]], slack: int = 32
                   ) -> list[list[tuple[Request, Sequence, int]]]:
    """Prefill rows (each feeding ``n`` tokens) in groups that run as one padded forward
    pass each, shortest first (:func:`length_groups`)."""
    return length_groups(rows, lambda row: row[2], slack)


def length_groups(items: list, length, slack: int = 32, tokens: int | None = None,
                  share: int = 4) -> list[list]:
    """``items`` in groups that run as one padded pass each, shortest first: an item joins the
    group before it while the padding that costs stays within 1 / ``share`` of the group's
    tokens and ``slack`` more, and (with ``tokens``) the pass within ``tokens`` padded
    positions. Prompts of 5 and 200 tokens padded together would compute 400 positions for
    205 tokens; apart, 205, for one more pass. ``length(item)``: its tokens.

    ``tokens`` bounds the encoder's passes (the engine's ``max_step_tokens``), and with them
    its activations: hundreds of sources admitted at once would make passes of thousands of
    positions, each layer's activations as large."""
    groups: list[list] = []
    real = 0  # the last group's real tokens
    for item in sorted(items, key=length):
        n = length(item)  # the longest so far: the group is padded to it
        padded = (len(groups[-1]) + 1) * n if groups else 0
        if groups and padded - (real + n) <= (real + n) // share + slack and (
                tokens is None or padded <= tokens):
            groups[-1].append(item)
            real += n
        else:
            groups.append([item])
            real = n
    return groups
