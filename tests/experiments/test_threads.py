"""experiments/threads.py: the same work timed in the main thread and in a second one, with
the engine's rows still decoding while it is timed (timing is never asserted)."""

from experiments import threads


def test_the_same_work_is_timed_in_one_thread_and_in_a_second():
    rows, results = threads.measure(repeats=0.02)
    assert [name for name, _ in rows] == ["linear layer: main thread / a second thread",
                                          "decode step, 31 rows: main thread / a second thread"]
    for name in ("linear layer", "decode step, 31 rows"):
        r = results[name]
        assert r["main_ms"] > 0 and r["second_thread_ms"] > 0 and r["main_again_ms"] > 0


def test_a_thread_gone_while_its_status_is_read_is_skipped(monkeypatch):
    """A thread may end between the listing of /proc/PID/task and the read of its status:
    opened, its read then fails with ESRCH (ProcessLookupError), which once failed CI."""
    import builtins
    import io

    real = builtins.open

    class Gone(io.StringIO):
        def __iter__(self):
            raise ProcessLookupError(3, "No such process")

    def opened(path, *args, **kwargs):
        return Gone() if "/task/" in str(path) else real(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", opened)
    assert threads.switches() == {}
