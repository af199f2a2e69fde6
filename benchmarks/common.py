"""Helpers shared by the benchmarks: timing, model sizes from presets, output."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from vaswani.config import load_run_config
from vaswani.devices import cpu_name

ROOT = Path(__file__).resolve().parents[1]


def preset_model(name: str, vocab_size: int):
    """The [model] of configs/NAME.toml with a given vocabulary, without dropout."""
    cfg = load_run_config(ROOT / "configs" / f"{name}.toml",
                          [f"model.vocab_size={vocab_size}", "model.dropout=0"])
    return cfg.model


def best_time(fn, repeats: int) -> float:
    """Minimum wall time of ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def interleaved_best(fns: list, repeats: int) -> list[float]:
    """Minimum wall time of each function, timed in alternation (a, b, a, b, ...) so that a
    change in machine load hits both sides alike; one warm-up call each first."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def hardware() -> dict:
    """What a result was measured on. The CPU machines differ between sessions (AVX2 only,
    or AVX-512 with bf16), and PyTorch's and CTranslate2's kernels with them, so figures are
    compared only within one file or one run."""
    return {"cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def report(title: str, rows: list[tuple[str, str]], results: dict, json_path: str | None):
    print(f"\n### {title}\n")
    print("| measure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    if json_path:
        Path(json_path).write_text(json.dumps({**results, "hardware": hardware()}, indent=2))
        print(f"\nwrote {json_path}")
