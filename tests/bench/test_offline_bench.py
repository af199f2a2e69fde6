"""benchmarks/offline.py: the attention-read row compares like with like, and the ceiling
row's stand-in for the gather is put back, and --profile's shares add up (timing is never
asserted)."""

import torch
from benchmarks import offline
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


def test_the_profile_splits_the_lm_rows_time_into_shares(small_runs, monkeypatch, tmp_path):
    run_dir, _ = small_runs["decoder"]
    monkeypatch.setattr(offline, "make_runs", lambda work: {"lm": run_dir})
    shares = offline.profile_lm(tmp_path, n=8)
    assert list(shares)[:3] == ["linear layers (addmm, mm)", "attention (SDPA)",
                                "paged KV gather (index_select)"]
    assert all(0 < share < 1 for share in shares.values())  # each kind takes some time
    assert abs(sum(shares.values()) - 1) < 0.01
