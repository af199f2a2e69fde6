"""Keeping freed memory for the engine's next step (Linux with glibc), the cache in huge
pages, and the cyclic garbage collector out of an offline run.

A decode step allocates its activations afresh and frees them before the next: the logits
alone are rows x vocabulary (8 MB for a beam-4 step of 64 sentences and an 8,000-token
vocabulary). glibc's malloc hands large freed blocks back to the operating system (blocks
past its mmap threshold at once; the heap's top once more than its trim threshold is free),
and adapts both thresholds as the process runs, so whether a step's tensors are reused or
faulted in again page by page depends on how the process happened to start. Measured on a
beam-4 translation of 300 sentences (``python -m benchmarks.offline --profile beam``): about
0.4 million minor page faults and 1 s of kernel time in 10 s without this, none with it.

:func:`keep_freed_memory` pins both thresholds (as the tract and zenoh projects do), so that
blocks up to 32 MiB come from the heap and up to 64 MiB of free heap stays with the process
for reuse. It changes the whole process's allocator, so the engine calls it on a CPU only,
and never where the operator has set glibc's own variables.

:func:`zeros_in_huge_pages`: the key/value cache's tensors (cache.py) in memory the kernel
backs with 2 MiB pages where it can (transparent huge pages, asked for with ``madvise``; the
kernel's default "madvise" mode gives them only to memory that asks). A decode step writes
each row's new keys at its own place in every layer's cache, hundreds of 256-byte writes
each on a 4 KiB page of its own, and the processor's TLB cannot hold that many pages: a
step's 1,200 such writes into one of 8 caches of 75 MB took 311 us in 4 KiB pages and 145 us
in huge pages, with other memory read between steps as a decode step does (``python -m
benchmarks.offline --cache-writes``; 2-vCPU Xeon, 2026-11-26).

:func:`collector_paused`: Python's cyclic garbage collector paused while an offline run
(``Engine.run``) steps. A beam search makes and drops many small objects (hypotheses, token
lists), and every so many the collector walks every object the process holds (some 290,000
once torch and a model are loaded) for cycles the engine does not make: on a beam-4
translation of 300 sentences with the demo model, 0.15 s of a 2.7 s run (one full
collection of 0.12 s; 2-core Xeon). Reference counting still frees everything as it goes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import math
import os
import sys

import torch
from torch import Tensor

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20  # glibc's largest (4 Mi x sizeof(long) on 64-bit)
TRIM_THRESHOLD = 64 << 20
OPERATOR_SET = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
HUGE_PAGE = 2 << 20  # the transparent huge page of x86-64 (and of aarch64 with 4 KiB pages)
MADV_HUGEPAGE = 14  # Linux's mman.h

_pinned: bool | None = None  # once per process


def keep_freed_memory() -> bool:
    """Pin glibc's mmap and trim thresholds (both: setting either stops glibc adapting the
    other). Returns whether they are pinned; False on other systems and C libraries, or
    where ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES`` is
    set (the operator's choice stands)."""
    global _pinned
    if _pinned is None:
        _pinned = _pin()
    return _pinned


@functools.cache  # finding the library runs ldconfig: 1.6 ms, once per process
def _libc(name: str):
    """The C library's function ``name`` on Linux; None elsewhere or where it lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):  # e.g. musl has no mallopt
        return None


def _pin() -> bool:
    mallopt = _libc("mallopt")
    if mallopt is None or any(v in os.environ for v in OPERATOR_SET):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off while the block runs, then as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def zeros_in_huge_pages(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
                        ) -> Tensor:
    """``torch.zeros(shape)``, on a CPU under Linux in memory asked to be backed by huge
    pages: a view, aligned to ``HUGE_PAGE``, of a slightly larger tensor, advised before the
    first write faults its pages in (a block the heap hands back already in use keeps its
    pages until the kernel merges them). Other devices, systems and tensors under a huge
    page: plain ``torch.zeros``."""
    nbytes = math.prod(shape) * dtype.itemsize
    madvise = _libc("madvise") if device.type == "cpu" and nbytes >= HUGE_PAGE else None
    if madvise is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    madvise(raw.data_ptr() + start, nbytes, MADV_HUGEPAGE)  # a refusal: 4 KiB pages, as ever
    return raw[start:start + nbytes].view(dtype).view(shape).zero_()
