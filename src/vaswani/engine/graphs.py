"""The decode step on a GPU, captured as CUDA graphs (as nano-vllm's model runner and
gpt-fast do): a decode step of a small model is a few hundred small kernels, each costing
more to launch from Python than the work it does; replaying a captured graph
launches them all at once.

A graph has fixed shapes, so a step is padded to a *bucket*: a batch size from a ladder (1,
2, 4, 8, then multiples of 8 up to ``max_rows``) and a number of keys read per row (a power
of two times the cache's alignment, up to the slot width). Padding rows feed ``<pad>`` at
position 0 and write to their slot's scratch column; their logits are dropped. Each bucket is
captured on first use (a warm-up on a side stream, then the capture); its inputs are static
buffers that each step fills in place, and it reads the cache's tensors where they lie, so
the graphs are captured again when the cache makes new ones (its slots widened).

On a CPU :class:`StaticDecoder` runs the same padded step without capturing anything, which
is how a CPU test checks that the padding changes no row's logits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .adapters import choice_of
from .cache import ALIGN, SlotCache
from .plan import StepPlan
from .step import forward_step


def batch_ladder(max_rows: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 8 up to ``max_rows`` (and ``max_rows`` itself)."""
    sizes = [b for b in (1, 2, 4) if b < max_rows] + list(range(8, max_rows, 8))
    return sorted({*sizes, max_rows})


def bucket(n: int, ladder: list[int]) -> int:
    return next(b for b in ladder if b >= n)


class StaticDecoder:
    """Decode steps padded to buckets; on CUDA (``capture``) each bucket a CUDA graph."""

    def __init__(self, model: torch.nn.Module, cache: SlotCache, *, pad_id: int,
                 capture: bool) -> None:
        self.model, self.cache, self.pad_id, self.capture = model, cache, pad_id, capture
        self.device = cache.device
        self.rows = batch_ladder(cache.max_rows)
        most = cache.max_width // ALIGN
        self.widths = [ALIGN * w for w in sorted({*(2 ** i for i in range(most.bit_length())
                                                   if 2 ** i < most), most})]
        B = self.rows[-1]
        d = dict(dtype=torch.long, device=self.device)
        self.ids, self.positions = torch.zeros(B, 1, **d), torch.zeros(B, 1, **d)
        self.columns = torch.zeros(B, 1, **d)
        self.sources, self.lengths = torch.zeros(B, **d), torch.ones(B, **d)
        self.graphs: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.resizes = cache.resizes
        self.mempool = None

    def step(self, ids: Tensor, positions: Tensor, columns: Tensor, width: int,
             sources: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
        """One decode step over slots 0 .. R - 1 (ids, positions, columns (R, 1)), reading
        ``width`` keys per row; a translator's rows read source slots ``sources`` (R,), of
        ``lengths`` (R,) tokens -> logits (R, V)."""
        c = self.cache
        R = ids.size(0)
        B = min(bucket(R, self.rows), c.allocated)  # no padding row past the slots there are
        W = min(bucket(width, self.widths), c.width)
        X = min(bucket(int(lengths.max()), self.widths), c.cross_width) if c.seq2seq else 0
        self.ids[:B].fill_(self.pad_id)
        self.positions[:B].zero_()
        self.columns[:B].fill_(c.width - 1)
        self.sources[:B].zero_()
        self.lengths[:B].fill_(1)
        self.ids[:R], self.positions[:R], self.columns[:R] = ids, positions, columns
        if c.seq2seq:
            self.sources[:R], self.lengths[:R] = sources, lengths
        if not self.capture:
            return self._forward(B, W, X)[:R]
        if self.resizes != c.resizes:  # the graphs read tensors that are gone
            self.graphs.clear()  # and with the last of them their memory pool:
            self.mempool = None  # capturing into a released pool is an error in CUDA's allocator
            self.resizes = c.resizes
        if (B, W, X) not in self.graphs:
            self.graphs[(B, W, X)] = self._capture(B, W, X)
        graph, logits = self.graphs[(B, W, X)]
        graph.replay()
        return logits[:R]

    def _forward(self, B: int, W: int, X: int) -> Tensor:
        """The padded step on the static buffers: what a graph captures."""
        cross = {}
        if self.cache.seq2seq:
            cross = dict(sources=self.sources[:B], lengths=self.lengths[:B], cross=X)
        plan = StepPlan(self.columns[:B], W, **cross)
        return forward_step(self.model, self.cache, self.ids[:B], self.positions[:B],
                            torch.zeros(B, dtype=torch.long, device=self.device), plan)

    def _capture(self, B: int, W: int, X: int) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up: lazy initialisations happen outside
            for _ in range(2):
                self._forward(B, W, X)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = self._forward(B, W, X)
        self.mempool = graph.pool()
        return graph, logits


def captured(model: torch.nn.Module, cache: SlotCache, config, device: torch.device, *,
             pad_id: int) -> StaticDecoder | None:
    """The engine's decode steps as CUDA graphs, captured now, where ``config`` (an
    EngineConfig) asks for them and the model runs on a GPU; None otherwise, and for a model
    serving several LoRA adapters (adapters.py: a graph replays one choice of them)."""
    if not (config.cuda_graphs and device.type == "cuda") or choice_of(model) is not None:
        return None
    return StaticDecoder(model, cache, pad_id=pad_id, capture=True)
