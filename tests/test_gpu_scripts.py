"""scripts/gpu_check.sh's helpers: the plugin that writes each failure as it happens, so that
a run cut off by the lent machine's time limit still says what failed."""

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


def names(array: str, script: str) -> set[str]:
    """The words of a bash array ``NAME=(...)`` in ``script``, normalised as pip does."""
    words = re.search(rf"^{array}=\((.*?)\)", script, re.M | re.S).group(1).split()
    return {canonicalize_name(w) for w in words}


def test_every_wheel_carried_to_the_gpu_machine_has_what_it_needs_there():
    """The lent machine has no package registry: a wheel whose requirement is neither carried
    nor on the machine fails its import there (fastapi 0.165 began to need opentelemetry-api,
    and the whole serve folder was skipped on the GPU). Read from the installed versions, the
    ones gpu_setup.sh fetches; markers as the machine's Python 3.12 on Linux reads them."""
    script = (ROOT / "scripts/gpu_setup.sh").read_text()
    carried, there = names("WHEELS", script), names("ON_THE_MACHINE", script)
    machine = {"python_version": "3.12", "python_full_version": "3.12.3", "os_name": "posix",
               "sys_platform": "linux", "platform_system": "Linux", "extra": "",
               "platform_machine": "x86_64", "implementation_name": "cpython",
               "platform_python_implementation": "CPython"}
    missing = {}
    for name in sorted(carried):
        for line in importlib.metadata.requires(name) or []:
            need = Requirement(line)
            if need.marker and not need.marker.evaluate(machine):
                continue
            if canonicalize_name(need.name) not in carried | there:
                missing.setdefault(name, []).append(need.name)
    assert missing == {}


def test_what_vaswani_and_its_cuda_suite_import_reaches_the_gpu_machine():
    """vaswani's own requirements (with [serve]) and the test requirements the CUDA suite
    imports without skipping are each carried or on the machine: llguidance (structured
    output) and jsonschema-rs were neither, and 24 tests of the H200's run failed on import."""
    script = (ROOT / "scripts/gpu_setup.sh").read_text()
    reachable = names("WHEELS", script) | names("ON_THE_MACHINE", script)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needs = {canonicalize_name(Requirement(line).name) for line in
             project["dependencies"] + project["optional-dependencies"]["serve"]}
    needs.add("jsonschema-rs")  # imported unskipped at the top of tests/serve and tests/engine
    assert needs - reachable == set()


def test_the_cuda_suite_is_dealt_into_shards_of_like_size_each_file_once():
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_shards

    everything = sorted(f.relative_to(ROOT).as_posix() for f in gpu_shards.test_files())
    for n in (1, 3, 4):
        dealt = gpu_shards.shards(n)
        assert sorted(f for shard in dealt for f in shard) == everything
        assert dealt == gpu_shards.shards(n)  # the same every time
        sizes = [sum(len((ROOT / f).read_text().splitlines()) for f in s) for s in dealt]
        assert max(sizes) <= 1.5 * min(sizes) + 600  # like sizes (files are whole)


def test_shard_results_are_recorded_by_shard_with_their_commit(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import json

    import gpu_shards

    book = tmp_path / "gpu-suite.json"
    first = tmp_path / "shard-1-of-2.json"
    first.write_text(json.dumps({"shard": "1/2", "commit": "abc1234", "passed": False,
                                 "rc": 1, "counts": "1 failed, 9 passed", "failed": ["t::x"],
                                 "seconds": 300, "device": "NVIDIA H100"}))
    gpu_shards.record([first], into=book)
    first.write_text(json.dumps({**json.loads(first.read_text()), "commit": "def5678",
                                 "passed": True, "rc": 0, "counts": "10 passed",
                                 "failed": []}))
    gpu_shards.record([first], into=book)  # a later run of the same shard replaces it
    said = dict(gpu_shards.status(2, into=book))
    assert said == {"1/2": "passed at def5678 on NVIDIA H100 (10 passed)", "2/2": "not run"}


def test_a_shard_result_is_read_from_its_log_with_whole_ids_and_quiet_counts():
    """The log's lines as pytest -q -rfE wrote them on an H200: -q's summary has no rule of
    "=", and a parametrized id holds spaces (both were lost: "no summary", "...[n")."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_shards

    log = ("E     rank 1: 3 passed in 2.00s  (a subprocess's output quoted in a failure)\n"
           "FAILED tests/training/test_sharded.py::test_fsdp_on_two_processes_equals_one_process\n"
           "FAILED tests/x.py::test_y - AssertionError: 1 == 0\n"
           "ERROR tests/serve/test_app.py::test_bad[n (9) is over the limit of 8]\n"
           "8 failed, 411 passed, 7 skipped, 32 warnings, 3 errors in 232.34s (0:03:52)\n")
    got = gpu_shards.result(log, "1/1", "d774c2a", 1, 237, "NVIDIA H200")
    assert got["counts"] == "8 failed, 411 passed, 7 skipped, 32 warnings, 3 errors"
    assert got["failed"] == [
        "tests/training/test_sharded.py::test_fsdp_on_two_processes_equals_one_process",
        "tests/x.py::test_y", "tests/serve/test_app.py::test_bad[n (9) is over the limit of 8]"]
    assert got["passed"] is False and got["shard"] == "1/1" and got["seconds"] == 237
    ruled = gpu_shards.result("===== 10 passed in 5.10s =====\n", "2/4", "abc", 0, 6, "H100")
    assert ruled["counts"] == "10 passed" and ruled["passed"] and ruled["failed"] == []
    assert gpu_shards.result("collecting ...", "1/1", "abc", 124, 540, "H100")["counts"] \
        == "no summary (cut off?)"


def test_a_shard_out_of_range_or_an_unknown_call_is_refused(capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_shards
    import pytest

    assert gpu_shards.main(["nothing"]) == 2
    with pytest.raises(SystemExit, match="K must be in 1..N"):
        gpu_shards.main(["files", "5", "4"])
    assert gpu_shards.main(["files", "2", "4"]) == 0
    assert capsys.readouterr().out.split() == gpu_shards.shards(4)[1]
