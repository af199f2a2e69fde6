"""A pytest plugin for runs that may be cut off: each failure's report is appended to
$OUT/failures.txt (or ./gpu-out/failures.txt) the moment it happens, not at the session's end.
Under pytest-xdist the controller writes (its workers' reports reach it), the workers don't.

    python -m pytest -p scripts.pytest_failures ...
"""

from __future__ import annotations

import os
from pathlib import Path

_WRITES = True


def pytest_configure(config) -> None:
    global _WRITES
    _WRITES = not hasattr(config, "workerinput")  # an xdist worker


def pytest_runtest_logreport(report) -> None:
    if report.failed and _WRITES:
        path = Path(os.environ.get("OUT", "gpu-out")) / "failures.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write(f"===== {report.nodeid} ({report.when})\n{report.longreprtext[-3000:]}\n")
