"""benchmarks/offline.py: --profile's shares add up (timing is never asserted)."""

from benchmarks import offline


def test_the_profile_splits_the_lm_rows_time_into_shares(small_runs, monkeypatch, tmp_path):
    run_dir, _ = small_runs["decoder"]
    monkeypatch.setattr(offline, "make_runs", lambda work: {"lm": run_dir})
    shares = offline.profile_lm(tmp_path, n=8)
    assert list(shares)[:3] == ["linear layers (addmm, mm)", "attention (SDPA)",
                                "KV cache writes and copies (index_put, index)"]
    assert all(0 < share < 1 for share in shares.values())  # each kind takes some time
    assert abs(sum(shares.values()) - 1) < 0.01
