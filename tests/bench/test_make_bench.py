"""benchmarks/__main__.py (``make bench``): every benchmark module of the package is run, each
with arguments its own parser takes, and what a machine lacks is skipped with its reason."""

import argparse
import importlib
import re
import sys

import pytest

from benchmarks import __main__ as bench
from tests.conftest import ROOT


def test_every_benchmark_module_is_run():
    """A module that can be run (``python -m benchmarks.NAME``) is in make bench's order,
    except peers.py, the child process that drives a peer engine for the others."""
    runnable = {p.stem for p in (ROOT / "benchmarks").glob("*.py")
                if re.search(r'^if __name__ == "__main__":', p.read_text(), re.M)}
    assert runnable - {"__main__", "peers"} == set(bench.ORDER)


class Parsed(Exception):
    """Raised once a benchmark's parser has read its arguments: nothing runs."""


@pytest.mark.parametrize("quick", [False, True])
def test_each_benchmark_takes_the_arguments_it_is_given(quick, tmp_path, monkeypatch):
    demo = tmp_path / "runs" / "demo-bible-en-es"
    demo.mkdir(parents=True)
    (demo / "config.toml").write_text("")
    monkeypatch.setattr(bench, "ROOT", tmp_path)  # as if `make demo` had run
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    real = argparse.ArgumentParser.parse_args

    def parse(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))  # a wrong argument: SystemExit(2) instead

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse)
    seen = []
    for name in bench.ORDER:
        runs = bench.plan(name, tmp_path / "out", tmp_path / "work", quick, "/nanoGPT",
                          "HEAD")
        assert isinstance(runs, list) and runs, (name, runs)
        module = importlib.import_module(f"benchmarks.{name}")
        for rest in runs:
            monkeypatch.setattr(sys, "argv", [f"benchmarks.{name}", *rest])
            with pytest.raises(Parsed):
                module.main()
            seen.append(name)
    assert set(seen) == set(bench.ORDER)
    assert any("bench-gpu-h200.json" in a for a in bench.plan("gpu", tmp_path, tmp_path,
                                                                quick, None)[0])


def test_what_a_machine_lacks_is_skipped_with_its_reason(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(bench, "ROOT", tmp_path)  # no demo run there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "make demo" in bench.plan("export", tmp_path, tmp_path, False, None)
    assert "--nanogpt CHECKOUT" in bench.plan("nanogpt", tmp_path, tmp_path, False, None)
    assert "--before REV" in bench.plan("trees", tmp_path, tmp_path, False, None)
    assert bench.plan("gpu", tmp_path, tmp_path, False, None) == "needs a CUDA GPU"
