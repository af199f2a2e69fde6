"""The reliability probe (tests/reliability/probe.py) as a pytest mode: every fault and bad
input of docs/reliability.md, each a test that fails unless its outcome is clean.

    pytest -m probe tests/reliability

`make test` leaves these out (marker ``probe``: the whole probe takes minutes, and the faults
that matter most are tests of their own in this folder); the last test below, which
`make test` runs, checks that the mode works on one case."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.reliability.probe import CASES, Probe, run_case


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return Probe(ROOT, tmp_path_factory.mktemp("vaswani-probe-"))


@pytest.mark.probe
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_probe_finds_it_clean(probe, case):
    result = run_case(probe, *case)
    if result["outcome"] == "skipped":
        pytest.skip(result["detail"])
    assert result["outcome"] == "clean", (result["detail"], result["commands"])


def test_the_probe_mode_runs_a_case_and_make_test_leaves_it_out():
    one = "tests/reliability/test_probe.py::test_the_probe_finds_it_clean[config-is-a-directory]"

    def pytest_run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               one, *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})

    done = pytest_run("-m", "probe")
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-2000:]
    left = pytest_run()
    assert "1 deselected" in left.stdout, left.stdout[-2000:]
