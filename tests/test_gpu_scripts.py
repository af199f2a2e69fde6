"""scripts/gpu_check.sh's helpers: the plugin that writes each failure as it happens, so that
a run cut off by the lent machine's time limit still says what failed."""

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_failures_are_written_as_they_happen(tmp_path):
    tests = tmp_path / "test_two.py"
    tests.write_text("def test_fine():\n    pass\n\n"
                     "def test_broken():\n    assert 1 + 1 == 3, 'arithmetic'\n")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "scripts.pytest_failures",
                        "-p", "no:cacheprovider", str(tests)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "OUT": str(out)})
    assert r.returncode == 1, r.stdout[-2000:]
    written = (out / "failures.txt").read_text()
    assert written.count("=====") == 1 and "test_two.py::test_broken (call)" in written
    assert "arithmetic" in written and "test_fine" not in written


def test_the_gpu_check_script_parses():
    r = subprocess.run(["bash", "-n", str(ROOT / "scripts/gpu_check.sh")], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
