"""Running the model over the engine's rows: encoding sources into the cache, and one forward
pass over rows that each feed some tokens (a prefill chunk, or the one token of a decode step)
and want the next-token logits after them.

Row r's new tokens sit at positions ``cached .. cached + n - 1`` of its context; their keys
and values are written into those columns of the row's cache slot, and it attends over the
slot's first ``Tk`` columns: a (R, 1, T, Tk) mask from the queries' positions (nn/masks.py
``position_mask``) hides the keys after each query. A padding query sits at position 0 (it
always sees one real key and computes nothing that is not finite) and writes to the slot's
scratch column, which nothing reads.

Every row reads its keys in a multiple of the cache's alignment (``aligned``), masked past
its own, and the attention runs by the kind of pass, not by its shapes (cpu/attention.py
``engine_pass``), so that neither the keys read past a row's own for its batch's longest nor
the number of rows change any of its bits: a row's logits are the same alone and in any
batch where the layers compute row by row (as the weight-only int8 and int4 ones do;
float32's BLAS may not). Whatever the schedule, a prompt token is computed by a prefill and
a generated one by a decoding step (scheduler.py ``_to_prefill``), but for a row recomputed
after a preemption: its generated tokens are prefilled, their attention summed in another
order than a decoding step's, a difference the int8 kernel's bfloat16 inputs mostly round
away (tests/engine/test_runner.py).

With ``bf16_prefill`` (config.py) a long prompt's int8 products are widened to bfloat16
(cpu/quantized.py ``widened``: faster at its many rows, not a decoding step's bits), and so
by role, not by pass (request.py ``Request.wide``): its prompt tokens always widened, its
generated ones always by the kernel. The scheduler prefills such a prompt's tokens apart
from its row's generated ones, its last token too (scheduler.py ``_to_prefill``); a pass
whose rows hold both kinds runs as two.

A decode step runs over every used slot, 0 .. R - 1, in slot order, so that its keys are a
view of the cache (cache.py); a slot whose row is not decoded this step (it is being
prefilled) rides along as padding. A prefill reads its rows' slots by index (a copy; a
prompt's many new tokens pay for it), and so does the compiled step (compiled.py), which
runs the decoded rows only.

Shapes: R rows, T new tokens (the longest row's), Tk keys, S source tokens, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..cpu.attention import engine_pass
from ..cpu.quantized import widened
from .adapters import choose
from .cache import SlotCache, aligned, parts
from .compiled import CompiledStep, encode_sources
from .graphs import StaticDecoder
from .plan import StepPlan
from .request import Request, Sequence
from .step import forward_step
from .tensors import tensor_of


def consecutive(slots: list[int]) -> list[tuple[int, int, int]]:
    """``slots`` as runs of slots that follow one another: (first index, first slot,
    length) each, in order."""
    runs: list[tuple[int, int, int]] = []
    for i, slot in enumerate(slots):
        if runs and runs[-1][1] + runs[-1][2] == slot:
            first, start, n = runs[-1]
            runs[-1] = (first, start, n + 1)
        else:
            runs.append((i, slot, 1))
    return runs


class Runner:
    def __init__(self, model: torch.nn.Module, cache: SlotCache, *, pad_id: int,
                 static: StaticDecoder | None = None) -> None:
        self.model, self.cache, self.pad_id = model, cache, pad_id
        self.static = static  # decode steps as CUDA graphs (graphs.py), on a GPU
        # decode steps compiled ahead of time (compiled.py), set by the run that has them
        self.compiled: CompiledStep | None = None
        self.device = next(model.parameters()).device

    def adapters(self, adapters: list[int]):
        """A context in which each row of the pass uses its request's LoRA adapter, where
        the model serves several (adapters.py)."""
        return choose(self.model, adapters, self.device)

    @torch.inference_mode()
    def encode(self, requests: list[Request]) -> None:
        """Encode the requests' sources and store each decoder layer's cross-attention keys
        and values in their requests' source slots (which all their rows read)."""
        # in the order of their slots, which mostly follow one another (the scheduler hands
        # a group over shortest first, an offline call's slots were taken longest first)
        requests = sorted(requests, key=lambda r: r.source_slot)
        lengths = tensor_of([len(r.prompt) for r in requests], self.device)
        S = int(lengths.max())
        src = torch.full((len(requests), S), self.pad_id, dtype=torch.long, device=self.device)
        for i, r in enumerate(requests):
            src[i, :len(r.prompt)] = torch.tensor(r.prompt, device=self.device)
        encoder = None if self.compiled is None else self.compiled.encoder
        # (traced for sources of 2 tokens or more; a 1-token one, <eos> alone, eagerly)
        if encoder is not None and S > 1 and not any(r.adapter for r in requests):
            cross = encoder(src, lengths)  # the pass compiled (compiled.py EncodeStep)
        else:
            with engine_pass("prefill"), self.adapters([r.adapter for r in requests]):
                cross = encode_sources(self.model, src, lengths)
        # a slice's copy for each run of slots that follow one another (mostly one or a
        # few runs): an index_copy_ or index_put over the slots is several times slower
        runs = consecutive([r.source_slot for r in requests])
        for i, pair in enumerate(cross):  # (B, Hkv, S, Dh) each
            for store, x in zip((self.cache.ck[i], self.cache.cv[i]), pair, strict=True):
                x = x.to(self.cache.dtype)  # (under autocast: bf16)
                for first, slot, n in runs:
                    store[slot:slot + n, :, :S] = x[first:first + n]

    @torch.inference_mode()
    def decode(self, rows: list[tuple[Request, Sequence]]) -> tuple[Tensor, list[int]]:
        """Each row feeds its one uncached token; returns the next-token logits (N, V) and,
        for each row, which of them are its own (its slot: the logits are not reordered)."""
        if self.compiled is not None and len(rows) <= self.compiled.max_rows:
            return self.compiled_rows([(r, s, 1) for r, s in rows]), list(range(len(rows)))
        n = self.cache.used
        if 2 * len(rows) < n:  # mostly padding: read the few rows' slots by index instead
            return self.forward([(r, s, 1) for r, s in rows], "decode"), list(range(len(rows)))
        scratch = self.cache.width - 1
        ids, positions, columns = [self.pad_id] * n, [0] * n, [scratch] * n
        for _, seq in rows:
            ids[seq.slot] = seq.tokens[-1]  # its one uncached token
            positions[seq.slot] = columns[seq.slot] = seq.cached
        keys = [self.keys(p + 1) for p in positions]
        width = max(keys)
        d = self.device
        ids, positions, columns = (tensor_of(x, d)[:, None] for x in (ids, positions, columns))
        if self.static is not None:  # a CUDA graph reads one padded width for all rows
            sources = lengths = None
            if self.cache.seq2seq:  # each row's source read by index (the graph's shapes)
                held = self.cache.held(n)
                sources = tensor_of(held, d)
                lengths = tensor_of([self.cache.lengths[g] for g in held], d)
            return self.static.step(ids, positions, columns, width, sources, lengths), \
                [seq.slot for _, seq in rows]
        # rows of unlike contexts (admitted at different times, or prompts of unlike
        # lengths): each part of the self-attention reads its own rows' keys
        self_parts = parts(keys)
        # rows in step (an offline batch) write one column c: a slice, not an index_put,
        # where no slot riding along as padding holds keys at c (a beam's spare does not)
        c = rows[0][1].cached
        column = c if (all(seq.cached == c for _, seq in rows) and all(
            owner.cached <= c for owner in self.cache.owners[:n])) else None
        cross = {}
        if self.cache.seq2seq:  # the leading source slots, read in place
            lengths = self.cache.lengths[:self.cache.sources_used]
            longest = max(lengths)
            cross = dict(cross=longest, groups=self.cache.groups(n), parts=self.cache.parts(),
                         lengths=None if min(lengths) == longest  # all alike: no mask
                         else tensor_of(lengths, d))
        plan = StepPlan(columns, width, column=column, self_parts=self_parts, **cross)
        adapters = [0] * n  # a slot riding along as padding: the base alone
        for request, seq in rows:
            adapters[seq.slot] = request.adapter
        with engine_pass("decode"), self.adapters(adapters):
            logits = forward_step(self.model, self.cache, ids, positions,
                                  torch.zeros(n, dtype=torch.long, device=d), plan)
        return logits, [seq.slot for _, seq in rows]

    @torch.inference_mode()
    def compiled_rows(self, rows: list[tuple[Request, Sequence, int]]) -> Tensor:
        """The compiled step (compiled.py) over ``rows``, each feeding its next ``n``
        uncached tokens as ``n`` rows of the step, one token each in the row's slot (a
        speculative pass's places: speculate.py) -> the logits after each, (sum of n, V)."""
        ids, positions, slots, sources, lengths = [], [], [], [], []
        seq2seq = self.cache.seq2seq
        for request, seq, n in rows:
            ids += seq.uncached()[:n]
            positions += range(seq.cached, seq.cached + n)
            slots += [seq.slot] * n
            if seq2seq:
                sources += [request.source_slot] * n
                lengths += [self.cache.lengths[request.source_slot]] * n
        cross = (sources, lengths) if seq2seq else ()
        return self.compiled.rows(self.cache, ids, positions, slots,
                                  self.keys(max(positions) + 1), *cross)

    def verify(self, rows: list[tuple[Request, Sequence, int]]) -> list[Tensor]:
        """The logits after each of a row's next ``n`` uncached tokens (its token and the
        tokens guessed after it: speculate.py), (n, V) each, as decoding steps compute
        them: by the compiled step, a row of it for each place, or eagerly (plan.py
        ``apart``)."""
        if self.compiled is not None and sum(n for *_, n in rows) <= self.compiled.max_rows:
            return list(self.compiled_rows(rows).split([n for *_, n in rows]))
        return list(self.forward(rows, "verify"))

    @torch.inference_mode()
    def forward(self, rows: list[tuple[Request, Sequence, int]], kind: str = "prefill"
                ) -> Tensor:
        """Each row feeds its next ``n`` uncached tokens; returns the logits (R, V) after the
        last of them. ``kind``: "prefill"; "decode", a decoding step's few rows, read by
        index (the attention of a decoding step: cpu/attention.py ``engine_pass``); or
        "verify", a row's token and the tokens guessed after it (speculate.py), the logits
        after each of them (R, T, V; a row's first ``n``), each computed as a decoding step
        computes it (plan.py ``apart``)."""
        if kind != "prefill":
            return self._forward(rows, kind)  # a widened request's rows: prefills only
        prompt = [request.wide and request.prompt_pending(seq) > 0 for request, seq, _ in rows]
        if all(prompt) or not any(prompt):
            return self._forward(rows, kind, widen=prompt[0])
        logits = None
        for widen in (True, False):  # a pass each: the rows feeding prompts, the others
            at = [i for i, p in enumerate(prompt) if p is widen]
            part = self._forward([rows[i] for i in at], kind, widen)
            if logits is None:
                logits = part.new_empty(len(rows), part.size(-1))
            logits[tensor_of(at, self.device)] = part
        return logits

    def _forward(self, rows: list[tuple[Request, Sequence, int]], kind: str,
                 widen: bool = False) -> Tensor:
        """One pass of :meth:`forward`; ``widen``: its int8 products in bfloat16."""
        device = self.device
        fed = [seq.uncached()[:n] for _, seq, n in rows]
        lengths = tensor_of([len(f) for f in fed], device)
        T = int(lengths.max())
        ids = torch.full((len(rows), T), self.pad_id, dtype=torch.long)
        for i, f in enumerate(fed):
            ids[i, :len(f)] = torch.tensor(f)
        start = tensor_of([seq.cached for _, seq, _ in rows], device)
        steps = torch.arange(T, device=device)[None, :]
        real = steps < lengths[:, None]  # (R, T)
        positions = torch.where(real, start[:, None] + steps, 0)  # padding: position 0
        columns = torch.where(real, positions, self.cache.width - 1)  # padding: scratch
        width = self.keys(max(seq.cached + n for _, seq, n in rows))
        slots = tensor_of([seq.slot for _, seq, _ in rows], device)
        cross = {}
        if self.cache.seq2seq:  # each row's source, read by index
            cross = dict(
                sources=tensor_of([r.source_slot for r, _, _ in rows], device),
                lengths=tensor_of([len(r.prompt) for r, _, _ in rows], device),
                cross=max(len(r.prompt) for r, _, _ in rows))
        verify = kind == "verify"
        plan = StepPlan(columns, width, slots=slots, apart=verify, **cross)
        with engine_pass("prefill" if kind == "prefill" else "decode"), \
                widened(widen), \
                self.adapters([request.adapter for request, _, _ in rows]):
            return forward_step(self.model, self.cache, ids.to(device), positions,
                                None if verify else lengths - 1, plan)

    def keys(self, n: int) -> int:
        """The keys a row of ``n`` reads: up to a multiple of the alignment (see the
        module), within its slot."""
        return min(aligned(n), self.cache.width)
