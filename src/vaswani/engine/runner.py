"""Running the model over the engine's rows: encoding sources into the cache, and one forward
pass over a batch of rows that each feed some tokens (a prefill chunk, or the one token of a
decode step) and want the next-token logits after them.

A batch is padded to its longest row. Row r's new tokens sit at cache positions
``cached .. cached + n - 1``; their keys and values are written into the row's blocks, and it
attends over its own blocks, whole: a (R, 1, T, Tk) mask from the queries' positions
(nn/masks.py ``position_mask``) hides the keys after each query. Padding writes to the
scratch block and reads from it, masked; a padding query sits at position 0, so it always
sees one real key and computes nothing that is not finite.

Shapes: R rows, T new tokens (the longest row's), Tk keys, S source tokens, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..nn import masks
from .cache import SCRATCH, KVPool, StepCache, slots
from .graphs import StaticDecoder
from .request import Request, Sequence


class Runner:
    def __init__(self, model: torch.nn.Module, pool: KVPool, *, block_size: int,
                 pad_id: int, static: StaticDecoder | None = None) -> None:
        self.model, self.pool = model, pool
        self.block_size, self.pad_id = block_size, pad_id
        self.static = static  # decode steps as CUDA graphs (graphs.py), on a GPU
        self.device = next(model.parameters()).device

    def _tables(self, tables: list[list[int]]) -> Tensor:
        """Block tables (R, longest), padded with the scratch block."""
        width = max(1, max(len(t) for t in tables))
        return torch.tensor([t + [SCRATCH] * (width - len(t)) for t in tables],
                            dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def encode(self, requests: list[Request]) -> None:
        """Encode the requests' sources and store each decoder layer's cross-attention keys
        and values in their cross blocks (once per request; its beams share them)."""
        lengths = torch.tensor([len(r.prompt) for r in requests], device=self.device)
        S = int(lengths.max())
        src = torch.full((len(requests), S), self.pad_id, dtype=torch.long, device=self.device)
        for i, r in enumerate(requests):
            src[i, :len(r.prompt)] = torch.tensor(r.prompt, device=self.device)
        keep = torch.arange(S, device=self.device)[None, :] < lengths[:, None]  # (B, S)
        memory = self.model.encode(src, src_mask=keep)  # (B, S, D)
        where = slots(self._tables([r.cross for r in requests]),
                      torch.arange(S, device=self.device).expand(len(requests), S),
                      self.block_size)
        where = torch.where(keep, where, SCRATCH).reshape(-1)  # padding to the scratch block
        for i, (k, v) in enumerate(self.model.cross_keys_values(memory)):  # (B, Hkv, S, Dh)
            B, H, _, D = k.shape
            self.pool.k[i].index_copy_(0, where, k.transpose(1, 2).reshape(B * S, H, D))
            self.pool.v[i].index_copy_(0, where, v.transpose(1, 2).reshape(B * S, H, D))

    @torch.inference_mode()
    def decode(self, rows: list[tuple[Request, Sequence]]) -> Tensor:
        """Each row feeds its one uncached token; returns the next-token logits (R, V) (on a
        GPU through a captured graph)."""
        if self.static is None or len(rows) > self.static.rows[-1]:
            return self.forward([(r, s, 1) for r, s in rows])
        d = self.device
        ids = torch.tensor([s.uncached()[0] for _, s in rows], device=d)
        positions = torch.tensor([s.cached for _, s in rows], device=d)
        tables = self._tables([s.table for _, s in rows])
        cross = sources = None
        if rows[0][0].seq2seq:
            cross = self._tables([r.cross for r, _ in rows])
            sources = torch.tensor([len(r.prompt) for r, _ in rows], device=d)
        return self.static.step(ids, positions, tables, cross, sources)

    @torch.inference_mode()
    def forward(self, rows: list[tuple[Request, Sequence, int]]) -> Tensor:
        """Each row feeds its next ``n`` uncached tokens; returns the logits (R, V) after the
        last of them."""
        device = self.device
        fed = [seq.uncached()[:n] for _, seq, n in rows]
        lengths = torch.tensor([len(f) for f in fed], device=device)
        T = int(lengths.max())
        ids = torch.full((len(rows), T), self.pad_id, dtype=torch.long)
        for i, f in enumerate(fed):
            ids[i, :len(f)] = torch.tensor(f)
        start = torch.tensor([seq.cached for _, seq, _ in rows], device=device)
        steps = torch.arange(T, device=device)[None, :]
        real = steps < lengths[:, None]  # (R, T)
        positions = torch.where(real, start[:, None] + steps, 0)  # padding: position 0
        tables = self._tables([seq.table for _, seq, _ in rows])  # (R, n): keys 0 .. n*bs-1
        write = torch.where(real, slots(tables, positions, self.block_size), SCRATCH)
        kwargs = {}
        cross_read = None
        if rows[0][0].seq2seq:
            cross_read = self._tables([r.cross for r, _, _ in rows])
            source = torch.tensor([len(r.prompt) for r, _, _ in rows], device=device)
            kwargs["memory_mask"] = masks.length_mask(source, cross_read.size(1) * self.block_size)
        return self.model.decode_step(
            ids.to(device), positions=positions,
            mask=masks.position_mask(positions, tables.size(1) * self.block_size),
            cache=StepCache(self.pool, tables, write, cross_read), last=lengths - 1, **kwargs)
