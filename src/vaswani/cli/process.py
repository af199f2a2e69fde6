"""The process-wide settings of a ``vaswani`` command: the command line makes them, once, for
the process it owns; the library never does (a program that imports vaswani keeps its own).

glibc's malloc: blocks above its mmap threshold come as fresh pages from the kernel and go
back to it when freed, and a free top of the heap past its trim threshold is given back too;
glibc adapts both thresholds as the process runs. A training step, or an engine's decode step,
frees and asks again for the same large tensors every step (the demo's logits, 1,440 x 6,000
floats, are 34.6 MB), so each step would pay the kernel to map and zero them anew, and how
much depends on how the process happened to start. With both thresholds pinned at
:data:`KEEP_BELOW` the blocks stay in the process for the next step: the same results to the
bit, a peak memory a little higher (docs/performance.md says what it buys). Linux with glibc
only; left alone where the user set malloc's own variables (:data:`MALLOC_SETTINGS`).
"""

from __future__ import annotations

import os
import sys

from ..devices import c_function

KEEP_BELOW = 1 << 30  # bytes: blocks up to this size come from the heap, and a free heap
# top up to this size stays in the process
MALLOC_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>


def keep_freed_memory() -> bool:
    """Pin glibc's mmap and trim thresholds at :data:`KEEP_BELOW` (both: setting either stops
    glibc adapting the other). Returns whether it changed them."""
    if sys.platform != "linux" or any(name in os.environ for name in MALLOC_SETTINGS):
        return False
    mallopt = c_function("mallopt")
    if mallopt is None:
        return False
    return (mallopt(M_MMAP_THRESHOLD, KEEP_BELOW) == 1
            and mallopt(M_TRIM_THRESHOLD, KEEP_BELOW) == 1)
