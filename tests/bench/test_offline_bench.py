"""benchmarks/offline.py: --profile's shares add up, for every row it profiles (timing is
never asserted)."""

import pytest

from benchmarks import offline


@pytest.mark.parametrize("row", ["lm", "translate", "beam"])
def test_the_profile_splits_a_rows_time_into_shares(row, small_runs, copy_run, monkeypatch,
                                                    tmp_path):
    runs = {"lm": small_runs["decoder"][0], "translator": copy_run[0]}
    monkeypatch.setattr(offline, "make_runs", lambda work: runs)
    profiled = offline.profile_row(tmp_path, row, n=8)
    assert profiled["seconds"] > 0 and profiled["minor_page_faults"] >= 0
    shares = profiled["shares"]
    assert list(shares)[:3] == ["linear layers (addmm, mm, oneDNN)",
                                "attention (SDPA, or written out: bmm, softmax)",
                                "KV cache writes and copies (index_put, index, index_copy)"]
    assert all(0 <= share < 1 for share in shares.values())
    main = [*list(shares)[:3], "everything else"]  # choosing tokens may round to 0.000
    assert all(shares[kind] > 0 for kind in main)  # each of these takes some time
    assert abs(sum(shares.values()) - 1) < 0.01


def test_a_trained_translators_own_test_sentences_can_be_profiled(copy_run, tmp_path):
    """--profile beam --profile-run RUN_DIR: the run's first test sentences, not the preset's
    model; a language model row is refused for a translator."""
    profiled = offline.profile_row(tmp_path, "beam", n=8, run_dir=str(copy_run[0]))
    assert abs(sum(profiled["shares"].values()) - 1) < 0.01 and profiled["seconds"] > 0
    with pytest.raises(ValueError, match="--profile-run takes a translator"):
        offline.profile_row(tmp_path, "lm", n=8, run_dir=str(copy_run[0]))
