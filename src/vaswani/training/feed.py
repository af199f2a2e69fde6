"""The training step's batches on its device: each optimizer step's micro-batches, built on
the host (every batch a pure function of its index: data/batching.py) and copied over.

On a GPU the step does not wait for them. A thread of its own builds the next step's
micro-batches while this one runs, in pinned (page-locked) host memory, from which a
``non_blocking`` copy is truly asynchronous (from ordinary memory it waits for the host);
the copy then overlaps the kernels already queued. On a CPU there is nothing to overlap, and a
second thread computing beside the step slows both on a few cores (docs/performance.md): the
batches are built when the step asks for them.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ..data.batching import Batch


class Feed:
    """``take(step)``: the ``grad_accum`` micro-batches of optimizer step ``step`` on
    ``device``, with their host counts. ``ahead`` (default: on CUDA) builds the next step's
    in a thread while this one runs, and ``pin`` (default: likewise) pins them."""

    def __init__(self, batches, device: torch.device, grad_accum: int, *,
                 ahead: bool | None = None, pin: bool | None = None) -> None:
        self.batches, self.device, self.grad_accum = batches, device, grad_accum
        on_gpu = device.type == "cuda"
        self.ahead = on_gpu if ahead is None else ahead
        self.pin = on_gpu if pin is None else pin
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="vaswani-feed") \
            if self.ahead else None
        self.next: tuple[int, Future] | None = None  # (step, its host batches, being made)

    def host(self, step: int) -> list[Batch]:
        """Step ``step``'s micro-batches on the host (pinned where asked)."""
        micro = [self.batches.micro_batch(step * self.grad_accum + k)
                 for k in range(self.grad_accum)]
        return [b.pinned() for b in micro] if self.pin else micro

    def take(self, step: int) -> list[Batch]:
        if self.pool is None:
            return [b.to(self.device) for b in self.host(step)]
        if self.next is not None and self.next[0] == step:
            micro = self.next[1].result()
        else:  # the first step, or one the feed did not expect (a resume, a replan)
            micro = self.host(step)
        self.next = (step + 1, self.pool.submit(self.host, step + 1))
        return [b.to(self.device) for b in micro]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool, self.next = None, None
