"""A worker process of ``vaswani.load(..., workers=N)`` (inference/workers.py), started as
``python -m vaswani.cli.worker FD``. Its process is vaswani's own, as a ``vaswani`` command's
is, so it runs under the settings the command line makes for the process it owns
(process.py: glibc's malloc thresholds pinned), then serves its caller on the socket at file
descriptor FD. Unpinned, the demo translator's beam-4 calls split across two workers ran
about 4% slower (docs/performance.md, "Translating with a worker per core")."""

from __future__ import annotations

import sys

from ..inference.workers import main
from .process import keep_freed_memory

if __name__ == "__main__":
    main(int(sys.argv[1]), malloc_pinned=keep_freed_memory())
