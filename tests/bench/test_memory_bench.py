"""benchmarks/memory.py: a run loaded with int8 weights in a process of its own reports its
resident memory and its peak from /proc/self/status, and the text it generated."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_the_memory_of_a_loaded_language_model_is_read_from_the_process(small_runs, tmp_path):
    run_dir, _ = small_runs["decoder"]
    out = tmp_path / "memory.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.memory", str(run_dir),
                           "--quantize", "int8", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result == json.loads(done.stdout.strip().splitlines()[-1])
    assert result["quantize"] == "int8"
    # PyTorch alone is well over 100 MB; the peak is at least what is resident now
    assert 100 < result["resident_mb"] <= result["peak_mb"] < 10_000
    assert isinstance(result["text"], str) and result["machine"]["cpu"]
