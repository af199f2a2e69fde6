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
