"""The shape of the package, as docs/architecture.md draws it: layers that only import
downwards and no import loops (the import-linter contracts in pyproject.toml, imports inside
functions included), and files short enough to read."""

from pathlib import Path

import pytest

from tests.conftest import ROOT

importlinter = pytest.importorskip("importlinter.cli", reason="import-linter is a test extra")

MAX_LINES = 400


def test_layers_and_no_import_loops(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    status = importlinter.lint_imports(config_filename="pyproject.toml", no_cache=True,
                                       no_logo=True)
    assert status == 0, capsys.readouterr().out


def test_no_source_file_is_longer_than_it_should_be():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "src").rglob("*.py"))
            if (n := len(Path(p).read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these (over {MAX_LINES} lines): {long}"


def test_the_engine_stays_an_orchestrator_and_only_the_scheduler_changes_a_requests_status():
    """engine.py steps the parts (token choice in sampler.py, beam searches in beam.py, rows in
    scheduler.py) and stays short; a request's status is set nowhere but scheduler.py (and
    its first value, in request.py)."""
    import re

    engine = ROOT / "src" / "vaswani" / "engine"
    assert len((engine / "engine.py").read_text().splitlines()) < 200
    writes = {str(p.relative_to(ROOT)) for p in sorted((ROOT / "src").rglob("*.py"))
              if re.search(r"(?<![=!<>])=(?!=)[^=\n]*\bStatus\.[A-Z]", p.read_text())}
    assert writes == {"src/vaswani/engine/scheduler.py", "src/vaswani/engine/request.py"}, writes


# a timing (12 ms, 145 us), a speed ratio (1.7x), a date (2026-11-26), a benchmark's command
MEASUREMENT = (r"\b\d[\d,.]*\s?(ms|us|µs)\b|\b\d+(\.\d+)?x\b(?![{}])|\b20\d\d-\d\d-\d\d\b"
               r"|benchmarks\.")


def test_measurements_live_in_the_docs_not_in_the_code():
    """The code says why in a line and points at docs/; figures, with their machine, date and
    command, are in docs/ and docs/results/, where they are kept current."""
    import re

    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in sorted((ROOT / "src").rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(MEASUREMENT, line)]
    assert not found, "\n".join(found)
    assert re.search(MEASUREMENT, "0.27 ms against 0.39; 1.7x faster")  # the test can fail
