"""benchmarks/offline.py: --profile's shares add up, for both rows it profiles (timing is
never asserted)."""

import pytest
from benchmarks import offline


@pytest.mark.parametrize("row", ["lm", "translate"])
def test_the_profile_splits_a_rows_time_into_shares(row, small_runs, copy_run, monkeypatch,
                                                    tmp_path):
    runs = {"lm": small_runs["decoder"][0], "translator": copy_run[0]}
    monkeypatch.setattr(offline, "make_runs", lambda work: runs)
    shares = offline.profile_row(tmp_path, row, n=8)
    assert list(shares)[:3] == ["linear layers (addmm, mm)", "attention (SDPA)",
                                "KV cache writes and copies (index_put, index)"]
    assert all(0 < share < 1 for share in shares.values())  # each kind takes some time
    assert abs(sum(shares.values()) - 1) < 0.01
