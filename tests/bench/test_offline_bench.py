"""benchmarks/offline.py: the attention-read row compares like with like (timing is never
asserted)."""

from benchmarks.offline import attention_read


def test_the_paged_and_the_slot_attention_read_the_same_keys():
    row = attention_read(quick=True)
    assert row["same_outputs"] is True
    assert set(row["ms"]) == {"paged", "slot"} and min(row["ms"].values()) > 0
