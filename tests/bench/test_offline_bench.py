"""benchmarks/offline.py: the attention-read row compares like with like, and the ceiling
row's stand-in for the gather is put back (timing is never asserted)."""

import torch
from benchmarks.offline import attention_read, without_the_gather

from vaswani.engine import cache


def test_the_paged_and_the_slot_attention_read_the_same_keys():
    row = attention_read(quick=True)
    assert row["same_outputs"] is True
    assert set(row["ms"]) == {"paged", "slot"} and min(row["ms"].values()) > 0


def test_the_ceiling_row_swaps_the_gather_for_a_ready_buffer_and_puts_it_back():
    real = cache.PagedKV._gather
    pool = cache.KVPool(1, 9, 4, 2, 8, dtype=torch.float32, device=torch.device("cpu"))
    kv = cache.PagedKV(pool, 0, torch.tensor([[1, 2], [3, 4], [5, 6]]))
    with without_the_gather():
        assert cache.PagedKV._gather is not real
        assert kv.k.shape == (3, 2, 8, 8) and kv.v.shape == (3, 2, 8, 8)
    assert cache.PagedKV._gather is real
