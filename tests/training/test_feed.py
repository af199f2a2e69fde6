"""training/feed.py: each optimizer step's micro-batches on the device. Built a step ahead in
a thread of their own (a GPU's default: the step does not wait for the host), they are the
batches built when asked, in the same order; a step the feed did not expect is built then.
Pinning needs a GPU: tests/cuda/test_cuda.py."""

import threading

import torch

from vaswani.data.batching import Batch
from vaswani.training.feed import Feed


class Numbered:
    """Batches whose tensor is their index; each call recorded with its thread."""

    def __init__(self):
        self.calls = []

    def micro_batch(self, i):
        self.calls.append((i, threading.current_thread().name))
        return Batch({"x": torch.full((2, 3), i)}, targets=6, tokens=6)


def taken(feed, steps):
    return [[int(b["x"][0, 0]) for b in feed.take(step)] for step in steps]


def test_a_feed_ahead_gives_the_batches_built_when_asked_and_builds_the_next_in_a_thread():
    steps = [0, 1, 2, 3, 7, 8]  # 7: a step the feed did not expect (a resume, say)
    now, ahead = Numbered(), Numbered()
    plain = taken(Feed(now, torch.device("cpu"), 2), steps)
    feed = Feed(ahead, torch.device("cpu"), 2, ahead=True, pin=False)
    got = taken(feed, steps)
    feed.close()
    assert got == plain == [[2 * s, 2 * s + 1] for s in steps]
    threads = {i: name for i, name in ahead.calls}
    assert all(name.startswith("vaswani-feed") for i, name in threads.items()
               if i // 2 in (1, 2, 3, 8))  # made ahead, beside the step before
    assert all(threads[i] == threading.current_thread().name for i in (0, 1, 14, 15))
    assert {name for _, name in now.calls} == {threading.current_thread().name}


def test_a_cpu_feed_builds_in_the_step_and_keeps_the_host_counts():
    feed = Feed(Numbered(), torch.device("cpu"), 3)
    assert feed.pool is None and not feed.pin  # no thread on a CPU: it would slow the step
    micro = feed.take(4)
    assert [b.tokens for b in micro] == [6, 6, 6] and [b.targets for b in micro] == [6, 6, 6]
