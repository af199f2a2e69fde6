"""benchmarks/structured.py on the small language model: both rows timed in alternating
rounds, the grammar's own costs measured, the constrained output checked apart."""

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_the_structured_benchmark_times_free_and_schema_rows(small_runs, tmp_path):
    out = tmp_path / "structured.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.structured", "--run",
                           str(small_runs["decoder"][0]), "--tokens", "24", "--rounds", "2",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["ms_per_token"]) == {"free", "schema"}
    assert all(v > 0 for v in result["ms_per_token"].values())
    assert result["schema_over_free"] > 0 and result["mask_ms_mean"] > 0
    assert result["schema_tokens"] > 1 and result["schema_output"].startswith('{"name": "')
    assert result["compiled"] is False and "schema / free" in done.stdout
