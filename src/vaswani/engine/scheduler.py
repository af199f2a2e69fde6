"""Which rows run in the engine's next step; nothing here runs a model.

Every step:

1. requests cancelled since the last step are retired (their blocks freed at once);
2. every running row with exactly one token not yet cached is decoded (it feeds that token
   and gets its next one); a language model's row whose context would pass ``max_len``
   slides first (its context is cut to the last half window and recomputed, as
   generation/steppers.py ``LMStepper`` does);
3. rows with more uncached tokens (a prompt, a slid context, a preempted request being
   recomputed) are prefilled, in chunks, under a budget of ``max_step_tokens`` tokens;
4. waiting requests are admitted in arrival order while rows, blocks and the budget allow.

Blocks are reserved before the step runs: a decoded row that starts a new block gets one,
and a beam search keeps room to copy a block for each hypothesis it may fork. When the pool
runs out, the most recently admitted request is preempted: its blocks are freed and it goes
back to the front of the queue, keeping its tokens, to be recomputed later. No request is
dropped, and each finishes exactly once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .cache import BlockManager
from .request import Request, Sequence, Status


@dataclass
class Plan:
    """One step's work: sources to encode, chunks to prefill, rows to decode."""

    encode: list[Request] = field(default_factory=list)
    prefill: list[tuple[Request, Sequence, int]] = field(default_factory=list)  # n tokens
    decode: list[tuple[Request, Sequence]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.encode or self.prefill or self.decode)


class Scheduler:
    def __init__(self, blocks: BlockManager, *, max_rows: int, max_step_tokens: int,
                 max_len: int) -> None:
        self.blocks = blocks
        self.max_rows, self.max_step_tokens, self.max_len = max_rows, max_step_tokens, max_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in order of admission
        self.failed: list[Request] = []  # requests the cache could never hold
        self.preemptions = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def rows(self) -> int:
        return sum(len(r.sequences) for r in self.running)

    def plan(self) -> Plan:
        plan = Plan()
        budget = self.max_step_tokens
        for request in list(self.running):  # decode what is ready; go on with prefills
            for seq in request.sequences:
                if request.status is not Status.RUNNING:
                    break  # preempted to make room for an older request
                if not request.seq2seq and seq.context > self.max_len:
                    self.slide(seq)
                n = self._to_prefill(request, seq, budget)
                if len(seq.uncached()) == 1:
                    if self._room(request, seq, 1):
                        plan.decode.append((request, seq))
                elif n and self._room(request, seq, n):
                    plan.prefill.append((request, seq, n))
                    budget -= n
        while self.waiting and budget > 0:  # admit
            request = self.waiting[0]
            if self._need(request) > self.blocks.total:  # even an empty cache is too small
                self._fail(self.waiting.popleft(), self._need(request))
                continue
            if self.rows + len(request.sequences) > self.max_rows or not self._admit(request):
                break
            self.waiting.popleft()
            self.running.append(request)
            request.status = Status.RUNNING
            if request.seq2seq:
                plan.encode.append(request)
            for seq in request.sequences:
                n = self._to_prefill(request, seq, budget)
                if len(seq.uncached()) == 1:
                    plan.decode.append((request, seq))
                elif n:
                    plan.prefill.append((request, seq, n))
                    budget -= n
        # a request preempted after some of its rows were planned runs none of them
        plan.decode = [(r, s) for r, s in plan.decode if r.status is Status.RUNNING]
        plan.prefill = [(r, s, n) for r, s, n in plan.prefill if r.status is Status.RUNNING]
        return plan

    @staticmethod
    def _to_prefill(request: Request, seq: Sequence, budget: int) -> int:
        """How many of a row's uncached tokens to prefill now (0 when one is left: that one
        is decoded). A beam search's rows stop one short, so that they are all decoded, and
        searched, in the same step."""
        n = len(seq.uncached())
        if n <= 1:
            return 0
        return min(n - 1 if request.beam is not None else n, budget)

    def finish(self, request: Request) -> None:
        """Free a request's blocks and drop it (finished or cancelled)."""
        for seq in request.sequences:
            self.blocks.release(seq.table)
        self.blocks.release(request.cross)
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = Status.FINISHED

    # --- blocks --------------------------------------------------------------------------
    def _need(self, request: Request) -> int:
        """Blocks a request needs to be admitted: its source's and each row's context, and
        a beam search's room to fork."""
        need = sum(self.blocks.blocks_for(seq.context) for seq in request.sequences)
        need += self.blocks.blocks_for(len(request.prompt)) if request.seq2seq else 0
        return need + self._fork_room(request)

    def _fail(self, request: Request, need: int) -> None:
        request.error = ValueError(
            f"the engine's cache ({self.blocks.total} blocks of {self.blocks.block_size} "
            f"tokens) cannot hold this request ({need} blocks); give the engine a larger "
            "cache_tokens")
        self.failed.append(request)

    def _admit(self, request: Request) -> bool:
        """Blocks for the request's source and for each row's whole context, if the pool
        has them (no preemption for a newcomer)."""
        if self._need(request) > len(self.blocks.free):
            return False
        if request.seq2seq:
            request.cross = self.blocks.allocate(self.blocks.blocks_for(len(request.prompt)))
        for seq in request.sequences:
            seq.table = self.blocks.allocate(self.blocks.blocks_for(seq.context))
        return True

    def _room(self, request: Request, seq: Sequence, n: int) -> bool:
        """Make sure ``seq`` has blocks for ``n`` more tokens (and a beam search room to
        fork), preempting younger requests if the pool is short; False if ``request`` was
        the one preempted."""
        need = self.blocks.blocks_for(seq.cached + n) - len(seq.table)
        while need + self._fork_room(request) > len(self.blocks.free):
            victim = self.running[-1]
            if victim is request and len(self.running) == 1:  # alone, and still too big
                self.running.remove(request)
                self._fail(request, len(self.blocks.free) + 1)
                return False
            self._preempt(victim)
            if victim is request:
                return False
        seq.table += self.blocks.allocate(max(0, need))
        return True

    def _fork_room(self, request: Request) -> int:
        """Blocks a beam search may need this step: one copy per hypothesis it keeps."""
        return request.params.beam if request.beam is not None else 0

    def _preempt(self, request: Request) -> None:
        """Free all of a request's blocks and queue it first again: it keeps its tokens and
        is recomputed when readmitted."""
        for seq in request.sequences:
            self.blocks.release(seq.table)
            seq.cached = 0
        self.blocks.release(request.cross)
        self.running.remove(request)
        request.status = Status.WAITING
        self.waiting.appendleft(request)
        self.preemptions += 1

    def slide(self, seq: Sequence) -> None:
        """A language model's context past max_len: keep the last half window (positions
        restart), and recompute it."""
        seq.offset = len(seq.tokens) - max(1, self.max_len // 2)
        seq.cached = 0
        self.blocks.release(seq.table)
