"""The cached virtual environments of peers with heavy requirements (lm-evaluation-harness):
made by the benchmarks' helper, so that a test and a benchmark share one."""

from benchmarks.common import peer_venv

__all__ = ["peer_venv"]
