"""The key/value cache in huge pages, and the cyclic garbage collector out of an offline run.
(Keeping freed memory for the next step is the process's setting: the command line makes it,
cli/process.py.)

:func:`zeros_in_huge_pages`: the key/value cache's tensors (cache.py) in memory the kernel
backs with 2 MiB pages where it can (transparent huge pages, asked for with ``madvise``; the
kernel's default "madvise" mode gives them only to memory that asks). A decode step writes
each row's new keys at its own place in every layer's cache, hundreds of 256-byte writes
each on a 4 KiB page of its own, and the processor's TLB cannot hold that many pages
(docs/performance.md, "The engine's choices for a CPU").

:func:`collector_paused`: Python's cyclic garbage collector paused while an offline run
(``Engine.run``) steps. A beam search makes and drops many small objects (hypotheses, token
lists), and every so many the collector walks every object the process holds (hundreds of
thousands once torch and a model are loaded) for cycles the engine does not make.
Reference counting still frees everything as it goes.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math

import torch
from torch import Tensor

from ..devices import c_function

HUGE_PAGE = 2 << 20  # the transparent huge page of x86-64 (and of aarch64 with 4 KiB pages)
MADV_HUGEPAGE = 14  # Linux's mman.h


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
    madvise = c_function("madvise") if device.type == "cpu" and nbytes >= HUGE_PAGE else None
    if madvise is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    madvise(raw.data_ptr() + start, nbytes, MADV_HUGEPAGE)  # a refusal: 4 KiB pages, as ever
    return raw[start:start + nbytes].view(dtype).view(shape).zero_()
