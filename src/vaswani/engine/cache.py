"""The engine's key/value cache: a pool of fixed-size blocks, allocated once, written in
place, handed to sequences a block at a time.

Why blocks (paging) rather than one max_len slot per sequence (docs/architecture.md): memory
follows the tokens actually cached, so many short requests fit where slots would reserve
``max_len`` each; a translation's beams share the blocks of their common prefix and of their
source (copy-on-write of a partly filled last block when they part); and when the pool runs
out the scheduler can preempt a request and recompute it later instead of refusing work. The
price is a gather: each forward pass collects the keys and values it attends over from the
pool into a (B, Hkv, T, Dh) tensor for SDPA (the bytes attention reads anyway).

Layout, per decoder layer: keys and values of every cached token in two tensors of
``n_blocks * block_size`` slots, (slots, Hkv, Dh). Block b holds slots ``b * bs .. b * bs +
bs - 1``; a sequence's block table lists its blocks, and its token at position t sits in
slot ``table[t // bs] * bs + t % bs``. A layer's self-attention and its cross-attention (the
source's keys and values of a translation) share the layer's pool, in different blocks.
Block 0 is never handed out: the padding of a batch writes there, and reads of padding point
there (masked).

Shapes: R rows of a forward pass, T new tokens, Tk keys, Hkv key/value heads, Dh head dim.
"""

from __future__ import annotations

from functools import cached_property

import torch
from torch import Tensor

SCRATCH = 0  # the block that padding writes to and reads from


class OutOfBlocks(Exception):
    """The pool has fewer free blocks than asked for."""


class BlockManager:
    """Which blocks are free, and how many tables hold each of the others (a block shared
    by several beams is freed when the last one lets it go)."""

    def __init__(self, n_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        # Block 0 is the scratch block. Free blocks are a stack: the block freed last is
        # handed out first, so the engine keeps working in memory it touched recently (in
        # the CPU's caches, and resident: a long-idle page of a large pool can cost a fault).
        self.free: list[int] = list(range(n_blocks - 1, 0, -1))
        self.refs = [0] * n_blocks
        self.total = n_blocks - 1

    @property
    def used(self) -> int:
        return self.total - len(self.free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free):
            raise OutOfBlocks(f"{n} blocks asked, {len(self.free)} free")
        blocks = [self.free.pop() for _ in range(n)]
        for b in blocks:
            self.refs[b] = 1
        return blocks

    def share(self, table: list[int]) -> list[int]:
        """Another holder of the same blocks (read-only for both: a source's keys)."""
        for b in table:
            self.refs[b] += 1
        return list(table)

    def release(self, table: list[int]) -> None:
        for b in table:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free.append(b)
        table.clear()


class KVPool:
    """The preallocated tensors: keys and values of every layer's cached tokens."""

    def __init__(self, n_layers: int, n_blocks: int, block_size: int, n_kv_heads: int,
                 head_dim: int, *, dtype: torch.dtype, device: torch.device) -> None:
        shape = (n_layers, n_blocks * block_size, n_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        # What an attention reads is gathered into two buffers that every attention of a
        # forward pass reuses (one attention ends before the next reads): a fresh tensor of
        # several MB a layer, allocated and freed every step, costs the CPU a page fault per
        # 4 KB each time (malloc gives large blocks back to the system).
        self.reads = {"k": torch.empty(0, dtype=dtype, device=device),
                      "v": torch.empty(0, dtype=dtype, device=device)}

    def read_buffer(self, which: str, numel: int) -> Tensor:
        """The first ``numel`` elements of the keys' (``which="k"``) or values' read buffer,
        grown when a forward pass needs more."""
        if self.reads[which].numel() < numel:
            self.reads[which] = torch.empty(numel, dtype=self.k.dtype, device=self.k.device)
        return self.reads[which][:numel]

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def copy_block(self, source: int, target: int) -> None:
        """Copy one block's keys and values, every layer (copy-on-write of a shared block)."""
        bs = self.block_size
        self.k[:, target * bs:(target + 1) * bs] = self.k[:, source * bs:(source + 1) * bs]
        self.v[:, target * bs:(target + 1) * bs] = self.v[:, source * bs:(source + 1) * bs]


def fork(manager: BlockManager, pool: KVPool, table: list[int], length: int) -> list[int]:
    """A table for a new sequence that starts as a copy of one holding ``length`` tokens in
    ``table``: full blocks are shared; a partly filled last block, which the new sequence
    will write into, is copied into a block of its own."""
    full = length // manager.block_size
    out = manager.share(table[:full])
    if full < len(table):
        (own,) = manager.allocate(1)
        pool.copy_block(table[full], own)
        out.append(own)
    return out


def slots(tables: Tensor, positions: Tensor, block_size: int) -> Tensor:
    """tables (R, n_blocks) of block ids, positions (R, T) -> slot ids (R, T)."""
    return tables.gather(1, positions // block_size) * block_size + positions % block_size


class PagedKV:
    """One attention's view of its layer's pool in one forward pass: where the new tokens'
    keys and values go (``write``, (R, T) slots; None for a cross-attention, whose keys are
    in the pool already) and which blocks it attends over (``read``, (R, n) block tables:
    keys at positions 0 .. n * block_size - 1, the ones past a row's length masked). It
    follows the ``KV`` protocol of nn/kv_cache.py, so the model's layers use it unchanged.

    Reading whole blocks, each one contiguous run of ``block_size * Hkv * Dh`` values, is
    several times faster than reading token by token from a large pool."""

    def __init__(self, pool: KVPool, layer: int, read: Tensor,
                 write: Tensor | None = None) -> None:
        self.pool, self.read, self.write = pool, read, write
        self.k_pool, self.v_pool = pool.k[layer], pool.v[layer]
        self.block_size = pool.block_size

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new keys/values (R, Hkv, T, Dh) in place; return the ones to attend
        over, (R, Hkv, Tk, Dh)."""
        R, H, T, D = k.shape
        where = self.write.reshape(R * T)
        self.k_pool.index_copy_(0, where, k.transpose(1, 2).reshape(R * T, H, D))  # (R*T, H, D)
        self.v_pool.index_copy_(0, where, v.transpose(1, 2).reshape(R * T, H, D))
        return self.k, self.v

    def _gather(self, source: Tensor, which: str) -> Tensor:
        """The blocks ``read`` names, into the pool's read buffer (valid until the next
        attention reads)."""
        R, n = self.read.shape
        H, D = source.shape[1:]
        blocks = source.view(-1, self.block_size * H * D)  # (n_blocks, bs * H * D)
        out = self.pool.read_buffer(which, R * n * blocks.size(1)).view(R * n, blocks.size(1))
        torch.index_select(blocks, 0, self.read.reshape(-1), out=out)
        return out.view(R, n * self.block_size, H, D).transpose(1, 2)  # (R, Hkv, Tk, Dh)

    @cached_property
    def k(self) -> Tensor:
        return self._gather(self.k_pool, "k")

    @cached_property
    def v(self) -> Tensor:
        return self._gather(self.v_pool, "v")


class StepCache:
    """The cache as one forward pass sees it: per decoder layer a self-attention
    :class:`PagedKV` (and a cross-attention one for a translator), as ``layers[i]`` of
    nn/kv_cache.py's ``KVCache``."""

    def __init__(self, pool: KVPool, self_read: Tensor, self_write: Tensor,
                 cross_read: Tensor | None = None) -> None:
        self.layers = [(PagedKV(pool, i, self_read, self_write),
                        None if cross_read is None else PagedKV(pool, i, cross_read))
                       for i in range(pool.k.size(0))]
