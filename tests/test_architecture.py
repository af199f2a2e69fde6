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
    """The library's, the benchmarks' and the experiments' files alike."""
    files = [p for folder in ("src", "benchmarks", "experiments")
             for p in sorted((ROOT / folder).rglob("*.py"))]
    long = {str(p.relative_to(ROOT)): n for p in files
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


# a timing (12 ms, 145 us), a speed (530 a second), a speed ratio (1.7x), a date (2026-11-26),
# a benchmark's or an experiment's command
MEASUREMENT = (r"\b\d[\d,.]*\s?(ms|us|µs)\b|\b\d+(\.\d+)?x\b(?![{}])|\b20\d\d-\d\d-\d\d\b"
               r"|\b\d[\d,.]* (a|per) second\b|\b\d[\d,.]*\s?tok(ens)?/s\b"
               r"|benchmarks\.|experiments\.")


def test_measurements_live_in_the_docs_not_in_the_code():
    """The code says why in a line and points at docs/; figures, with their machine, date and
    command, are in docs/ and docs/results/, where they are kept current."""
    import re

    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in sorted((ROOT / "src").rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(MEASUREMENT, line)]
    assert not found, "\n".join(found)
    for figure in ("0.27 ms against 0.39; 1.7x faster", "530 a second 64 at a time",
                   "55.1 tok/s"):
        assert re.search(MEASUREMENT, figure)  # the test can fail


def test_importing_nn_loads_nothing_else_of_vaswani():
    """``import vaswani.nn`` (a learner's first import) reads the building blocks alone:
    the package's names load on first use, the model families on their first lookup."""
    import ast
    import subprocess
    import sys

    code = ("import sys, vaswani.nn\n"
            "print(sorted(m for m in sys.modules if m.startswith('vaswani')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    loaded = ast.literal_eval(out)  # the printed list of names
    assert "vaswani.nn.attention" in loaded
    assert [m for m in loaded if m != "vaswani" and not m.startswith("vaswani.nn")] == []
    import vaswani  # and every public name still loads, on first use

    assert all(getattr(vaswani, name) is not None for name in vaswani.__all__)
    # __all__ is written out for static readers; it names what the lazy table loads
    assert sorted(vaswani.__all__) == sorted(vaswani._WHERE)


def test_nn_reads_alone_like_the_paper():
    """nn/ is the Transformer's building blocks for a reader: it imports nothing of vaswani
    outside itself, and holds no engine, benchmark or CPU-tuning vocabulary (those live in
    engine/, benchmarks/ and cpu/, which swaps its fast paths into a built model)."""
    import re

    words = r"(?i:\b(slots?|engine|benchmarks?|onednn|mkldnn|cpu_is_intel)\b)"
    tuned = r"\b[A-Z]+_[A-Z_]*(QUERIES|KEYS|SCORES|MACS|ROWS)\b"  # a threshold by its name
    outside = r"^\s*from \.\.|^\s*import vaswani"
    pattern = "|".join((outside, words, tuned))
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in sorted((ROOT / "src" / "vaswani" / "nn").glob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(pattern, line)]
    assert not found, "\n".join(found)
    for bad in ("DECODE_QUERIES = 16", "from ..engine import x", "the engine's slots"):
        assert re.search(pattern, bad)  # the test can fail


def test_nn_modules_take_ready_made_parts_not_flags():
    """Every module of nn/ takes at most six parameters: a later model's quirk is a part handed
    in (a Rotary, a pair of norms, a residual block), not one more flag on the paper's class."""
    import importlib
    import inspect
    import pkgutil

    from torch import nn

    import vaswani.nn

    counts = {}
    for info in pkgutil.iter_modules(vaswani.nn.__path__):
        module = importlib.import_module(f"vaswani.nn.{info.name}")
        for name, cls in vars(module).items():
            if inspect.isclass(cls) and issubclass(cls, nn.Module) and \
                    cls.__module__ == module.__name__:
                counts[f"{info.name}.{name}"] = len(inspect.signature(cls).parameters)
    assert {"attention.MultiHeadAttention", "layers.DecoderLayer", "positional.Embeddings"} <= \
        set(counts)
    assert {name: n for name, n in counts.items() if n > 6} == {}
