"""The suite's own footprint: what a passing test writes is gone when it ends.

The slow tier imports, exports and fine-tunes real checkpoints (~8 GB of files in all); kept to
the end of the session, with the fast tier's beside them, they filled a CI machine's disk."""
import tomllib

from tests.conftest import ROOT

CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def _session(pytester, passing: bool):
    """A pytest session under the project's tmp_path settings, with tests/conftest.py's
    module_dir; the files left in its base directory afterwards."""
    pytester.makeini("[pytest]\n" + "".join(
        f"{key} = {CONFIG[key]}\n" for key in ("tmp_path_retention_policy",
                                               "tmp_path_retention_count")))
    pytester.makeconftest("from tests.conftest import module_dir  # noqa: F401\n")
    pytester.makepyfile(test_writes=f"""
        def test_one(tmp_path, module_dir):
            (tmp_path / "weights").write_bytes(b"0" * 1000)
            (module_dir / "shared").write_bytes(b"0" * 1000)

        def test_two(tmp_path, module_dir):
            (tmp_path / "weights").write_bytes(b"0" * 1000)
            assert {passing}
        """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    base = pytester.path.parent / "basetemp"
    return result, sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())


def test_a_passing_session_leaves_no_files(pytester):
    result, left = _session(pytester, passing=True)
    result.assert_outcomes(passed=2)
    assert left == []


def test_a_failing_test_keeps_its_files_and_only_its_own(pytester):
    result, left = _session(pytester, passing=False)
    result.assert_outcomes(passed=1, failed=1)
    assert left == ["test_two0/weights"]
