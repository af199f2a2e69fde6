"""benchmarks/threads.py: each case timed in the main thread, a second thread and the main
thread again, with context switches counted (timing is never asserted)."""

import torch
from benchmarks import threads


def test_each_case_is_timed_in_both_threads():
    rows, results = threads.measure(repeats=0.01)
    assert [r[0] for r in rows] == ["linear layer: main thread / a second thread",
                                    "decode step, 31 rows: main thread / a second thread"]
    for name in ("linear layer", "decode step, 31 rows"):
        r = results[name]
        assert r["main_ms"] > 0 and r["second_thread_ms"] > 0 and r["main_again_ms"] > 0
        assert r["switches_per_s_main"] >= 0 and r["switches_per_s_second_thread"] >= 0
    assert sum(threads.switches().values()) > 0  # /proc is read: this process has switched
    # a thread that ended between two readings takes nothing away
    assert threads.switched({"1": 10, "2": 500}, {"1": 12, "3": 4}) == 6
    assert torch.is_grad_enabled()  # measuring leaves the rest of the session as it was
