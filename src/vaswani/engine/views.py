"""One forward pass's view of the engine's cache (cache.py): per decoder layer, where the new
keys and values go and which keys each row attends over, as nn/kv_cache.py's ``KVCache``
does for one batch.

Shapes: R rows of a forward pass, T new tokens, Tk keys, Hkv key/value heads, Dh head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .plan import StepPlan


def flat_index(slots: Tensor, columns: Tensor, heads: int, width: int) -> Tensor:
    """Where the keys of rows in ``slots`` (R,) at ``columns`` (R, T) go in a cache tensor
    (rows, heads, width, Dh) seen as rows of Dh numbers: (R, heads, T), in the order of the
    keys (R, heads, T, Dh) a forward pass makes."""
    head = torch.arange(heads, device=slots.device)[None, :, None]
    return (slots[:, None, None] * heads + head) * width + columns[:, None, :]


def one_query_a_row(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, attend) -> Tensor:
    """``attend`` for each of a row's T queries apart, one query a row over the row's keys,
    laid out as a decoding step's query is (R, 1, H, Dh seen as R, H, 1, Dh): the same
    arithmetic, bit for bit. Side by side, or as R * T rows of one call, they would multiply
    in products whose kernels follow the shapes and strides, and differ in the last bits.
    q (R, H, T, Dh), k and v (R, Hkv, Tk, Dh), mask (R, 1, T, Tk) -> (R, H, T, Dh)."""
    def query(t: int) -> Tensor:
        return q[:, :, t:t + 1].transpose(1, 2).contiguous().transpose(1, 2)

    return torch.cat([attend(query(t), k, v, None if mask is None else mask[:, :, t:t + 1])
                      for t in range(q.size(2))], dim=2)


class SlotKV:
    """One attention's view of the cache in one forward pass, an nn/kv_cache.py
    ``AttentionCache``: ``append`` writes the new keys and values into their slots and
    returns the keys to attend over; a cross-attention's keys are there already (``k``,
    ``v``); ``attend`` runs the attention over rows as the cache lays them out.

    With ``groups`` (a cross-attention reading sources that several rows share), ``k`` and
    ``v`` are the G sources once each, and the attention passes its queries through
    ``queries`` (R rows -> G groups of K rows, as more queries of one row) and its output
    back through ``outputs``."""

    def __init__(self, k: Tensor, v: Tensor, rows: Tensor | None, n: int, width: int,
                 write: Tensor | int | None = None,
                 groups: tuple[Tensor, Tensor] | None = None,
                 parts: list[tuple[int, int, int]] | None = None, apart: bool = False,
                 compute: torch.dtype | None = None) -> None:
        self.k_all, self.v_all = k, v
        self.compute = compute or k.dtype  # the keys as the attention reads them (a
        # bfloat16 cache under a float32 model: EngineConfig.cache_dtype)
        self.rows, self.n, self.width, self.write = rows, n, width, write
        self.groups = groups
        self.parts = parts  # an attention in parts of rows (:func:`parts`)
        self.apart = apart  # each query a row of its own (:func:`one_query_a_row`)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v (R, Hkv, T, Dh) into their places ``write`` -> the keys and values to attend
        over, (R, Hkv, Tk, Dh). ``write`` (R, Hkv, T): where each key goes among the cache's
        keys seen as rows of Dh numbers (:func:`flat_index`); an int: column ``write`` of
        the first R slots (T = 1)."""
        if isinstance(self.write, int):  # a strided copy, a third of index_put's time
            c = self.write
            self.k_all[:self.n, :, c:c + 1] = k
            self.v_all[:self.n, :, c:c + 1] = v
            return self.k, self.v
        Dh, dtype = k.size(-1), self.k_all.dtype  # k may be bf16 (autocast: a training metric)
        self.k_all.view(-1, Dh).index_copy_(0, self.write.view(-1), k.reshape(-1, Dh).to(dtype))
        self.v_all.view(-1, Dh).index_copy_(0, self.write.view(-1), v.reshape(-1, Dh).to(dtype))
        return self.k, self.v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, attend) -> Tensor:
        """nn/kv_cache.py's ``AttentionCache.attend``: ``attend`` over the queries as the
        keys are laid out (:meth:`queries`), in ``parts`` of rows each over its own keys
        (cache.py :func:`parts`) or in one pass, the output back in the rows' order."""
        q = self.queries(q)
        if self.apart and q.size(2) > 1:
            out = one_query_a_row(q, k, v, mask, attend)
        elif self.parts is None:
            out = attend(q, k, v, mask)
        else:
            out = torch.cat([attend(q[a:b], k[a:b, :, :w], v[a:b, :, :w],
                                    None if mask is None else mask[a:b, ..., :w])
                             for a, b, w in self.parts])
        return self.outputs(out)

    def queries(self, q: Tensor) -> Tensor:
        """q (R, H, T, Dh) -> (G, H, K * T, Dh): each group's rows' queries side by side."""
        if self.groups is None:
            return q
        members, _ = self.groups  # (G, K)
        G, K = members.shape
        _, H, T, Dh = q.shape
        q = q.index_select(0, members.view(-1)).view(G, K, H, T, Dh)
        return q.transpose(1, 2).reshape(G, H, K * T, Dh)

    def outputs(self, out: Tensor) -> Tensor:
        """The inverse of :meth:`queries`: (G, H, K * T, Dh) -> (R, H, T, Dh)."""
        if self.groups is None:
            return out
        members, place = self.groups
        G, K = members.shape
        _, H, KT, Dh = out.shape
        out = out.view(G, H, K, KT // K, Dh).transpose(1, 2).reshape(G * K, H, KT // K, Dh)
        return out.index_select(0, place)

    def _read(self, t: Tensor) -> Tensor:
        if self.rows is None:  # the leading slots: a view, no copy (in the cache's dtype)
            return t[:self.n, :, :self.width].to(self.compute)
        return t[:, :, :self.width].index_select(0, self.rows).to(self.compute)

    @property
    def k(self) -> Tensor:
        return self._read(self.k_all)

    @property
    def v(self) -> Tensor:
        return self._read(self.v_all)


class StepCache:
    """Per decoder layer a self-attention :class:`SlotKV` (and a cross-attention one for a
    translator), as ``layers[i]`` of nn/kv_cache.py's ``KVCache``, over ``cache`` (a SlotCache)."""

    def __init__(self, cache, plan: StepPlan) -> None:
        p, n = plan, plan.columns.size(0)
        if p.column is not None and p.slots is None:  # where every layer writes its new keys
            write: Tensor | int = p.column
        else:
            slots = torch.arange(n, device=p.columns.device) if p.slots is None else p.slots
            write = flat_index(slots, p.columns, cache.shape[0], cache.width)
        if cache.seq2seq and p.sources is None and p.slots is not None:
            raise ValueError("rows read by index read their sources by index too")
        G = n if p.groups is None else p.groups[0].size(0)
        self.layers = [(SlotKV(cache.k[i], cache.v[i], p.slots, n, p.width, write,
                               parts=p.self_parts, apart=p.apart, compute=cache.compute),
                        SlotKV(cache.ck[i], cache.cv[i], p.sources, G, p.cross,
                               groups=p.groups, parts=p.parts, compute=cache.compute)
                        if cache.seq2seq else None)
                       for i in range(cache.n_layers)]
