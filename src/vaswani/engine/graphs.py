"""The decode step on a GPU, captured as CUDA graphs (as nano-vllm's model runner and
gpt-fast do): a decode step of a small model is a few hundred small kernels, each costing
~10-20 us to launch from Python, far more than the work they do; replaying a captured graph
launches them all at once.

A graph has fixed shapes, so a step is padded to a *bucket*: a batch size from a ladder (1,
2, 4, 8, then multiples of 8 up to ``max_rows``) and a context width (a power of two of blocks,
up to ``max_len``). Padding rows feed ``<pad>`` at position 0, write to the scratch block and
read only it; their logits are dropped. Each bucket is captured on first use (a warm-up on a
side stream, then the capture), its inputs are static buffers that each step fills in place.

On a CPU :class:`StaticDecoder` runs the same padded step without capturing anything, which
is how a CPU test checks that the padding changes no row's logits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..nn import masks
from .cache import SCRATCH, KVPool, StepCache, slots


def batch_ladder(max_rows: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 8 up to ``max_rows`` (and ``max_rows`` itself)."""
    sizes = [b for b in (1, 2, 4) if b < max_rows] + list(range(8, max_rows, 8))
    return sorted({*sizes, max_rows})


def bucket(n: int, ladder: list[int]) -> int:
    return next(b for b in ladder if b >= n)


class StaticDecoder:
    """Decode steps padded to buckets; on CUDA (``capture``) each bucket a CUDA graph."""

    def __init__(self, model: torch.nn.Module, pool: KVPool, *, max_rows: int, max_len: int,
                 pad_id: int, seq2seq: bool, capture: bool) -> None:
        self.model, self.pool, self.pad_id, self.seq2seq = model, pool, pad_id, seq2seq
        self.block_size = bs = pool.block_size
        self.capture = capture
        self.device = pool.k.device
        self.rows = batch_ladder(max_rows)
        most = -(-max_len // bs)  # blocks of a full context
        self.widths = sorted({*(2 ** i for i in range(most.bit_length()) if 2 ** i < most), most})
        B, W = self.rows[-1], most
        d = dict(dtype=torch.long, device=self.device)
        self.ids, self.positions = torch.zeros(B, 1, **d), torch.zeros(B, 1, **d)
        self.tables, self.cross = torch.zeros(B, W, **d), torch.zeros(B, W, **d)
        self.sources = torch.ones(B, **d)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.mempool = None
        if capture:  # the read buffers must not move once captured: their largest size now
            per_block = bs * pool.k.size(-2) * pool.k.size(-1)
            pool.read_buffer("k", B * W * per_block)
            pool.read_buffer("v", B * W * per_block)

    def step(self, ids: Tensor, positions: Tensor, tables: Tensor, cross: Tensor | None,
             sources: Tensor | None) -> Tensor:
        """One decode step of R rows (ids, positions (R,), tables (R, n), for a translator
        cross tables and source lengths) -> logits (R, V)."""
        R, n = tables.shape
        B = bucket(R, self.rows)
        W = bucket(max(n, cross.size(1) if cross is not None else 1), self.widths)
        self.ids[:B].fill_(self.pad_id)
        self.positions[:B].zero_()
        self.tables[:B].fill_(SCRATCH)
        self.ids[:R, 0], self.positions[:R, 0] = ids, positions
        self.tables[:R, :n] = tables
        if self.seq2seq:
            self.cross[:B].fill_(SCRATCH)
            self.sources[:B].fill_(1)
            self.cross[:R, :cross.size(1)], self.sources[:R] = cross, sources
        if not self.capture:
            return self._forward(B, W)[:R]
        if (B, W) not in self.graphs:
            self.graphs[(B, W)] = self._capture(B, W)
        graph, logits = self.graphs[(B, W)]
        graph.replay()
        return logits[:R]

    def _forward(self, B: int, W: int) -> Tensor:
        """The padded step on the static buffers: what a graph captures."""
        positions, tables = self.positions[:B], self.tables[:B, :W]
        write = slots(tables, positions, self.block_size)
        kwargs = {}
        cross_read = None
        if self.seq2seq:
            cross_read = self.cross[:B, :W]
            kwargs["memory_mask"] = masks.length_mask(self.sources[:B], W * self.block_size)
        return self.model.decode_step(
            self.ids[:B], positions=positions,
            mask=masks.position_mask(positions, W * self.block_size),
            cache=StepCache(self.pool, tables, write, cross_read),
            last=torch.zeros(B, dtype=torch.long, device=self.device), **kwargs)

    def _capture(self, B: int, W: int) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up: lazy initialisations happen outside
            for _ in range(2):
                self._forward(B, W)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = self._forward(B, W)
        self.mempool = graph.pool()
        return graph, logits
