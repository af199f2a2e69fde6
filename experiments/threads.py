"""Why a server runs all its models in one thread (serve/loop.py): the same PyTorch work in
the process's one computing thread, and in a second thread once the first has computed.

    python -m experiments.threads [--quick] [--json OUT.json]

PyTorch runs a CPU operator on a team of OpenMP threads, one team per Python thread that runs
operators. Measured here, alternating, in one process: a linear layer (32 x 256 by 256 x 1024)
and a decode step of the engine (the shakespeare-char preset's shape, 31 rows of 100-token
prompts), each first in the main thread, then in a new thread while the main thread's team
exists, then in the main thread again; with each thread's voluntary context switches a second
(its OpenMP helper sleeping and waking between operators instead of spinning).
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import threading
import time

import torch
import torch.nn.functional as F

from benchmarks.common import report


def switches() -> dict[str, int]:
    """Voluntary context switches of each thread of this process, by thread id."""
    counts = {}
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/status"):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        counts[path.split("/")[-2]] = int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended between the
            continue  # listing and the read (opened and gone: ESRCH on reading)
    return counts


def switched(before: dict[str, int], after: dict[str, int]) -> int:
    """Switches between two :func:`switches` readings, thread by thread: a thread that ended
    in between takes none of its count away (summed totals went negative when one did)."""
    return sum(n - before.get(tid, 0) for tid, n in after.items())


def timed(fn, repeats: int) -> tuple[float, float]:
    """Median milliseconds of ``fn()`` and voluntary context switches a second."""
    for _ in range(5):
        fn()
    before, times = switches(), []
    start = time.perf_counter()
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    rate = switched(before, switches()) / (time.perf_counter() - start)
    return statistics.median(times) * 1e3, rate


def in_thread(fn, repeats: int) -> tuple[float, float]:
    out = []
    worker = threading.Thread(target=lambda: out.append(timed(fn, repeats)))
    worker.start()
    worker.join()
    return out[0]


def engine_step():
    from vaswani import ModelConfig, build_model
    from vaswani.engine import Engine, EngineConfig, Params, Request, Status
    from vaswani.generation import Rules

    config = ModelConfig(arch="decoder", vocab_size=70, d_model=256, n_heads=4, d_ff=1024,
                         n_layers=4, dropout=0.0, max_len=512, norm_first=True,
                         positional="learned", scale_embeddings=False, activation="gelu")
    torch.manual_seed(0)
    engine = Engine(build_model(config).eval(), bos_id=1, eos_id=2,
                    config=EngineConfig(max_rows=32))
    params = Params(max_new_tokens=400, rules=Rules(min_length=400))  # no <eos>, in max_len
    requests = [engine.submit(Request([5] * 100, params)) for _ in range(31)]
    for _ in range(40):
        engine.step()
    assert all(r.status is Status.RUNNING for r in requests), "the rows are not decoding"
    return engine.step


def measure(repeats: float = 1.0) -> tuple[list, dict]:
    """The table's rows and the results (``repeats``: a share of the full run's)."""
    x, w = torch.randn(32, 256), torch.randn(1024, 256)
    cases = {"linear layer": (lambda: F.linear(x, w), 3000), "decode step, 31 rows":
             (engine_step(), 60)}
    rows, results = [], {}
    for name, (fn, n) in cases.items():
        repeats_here = max(2, int(n * repeats))
        main_ms, main_rate = timed(fn, repeats_here)
        thread_ms, thread_rate = in_thread(fn, repeats_here)
        again_ms, _ = timed(fn, repeats_here)
        results[name] = {"main_ms": round(main_ms, 4), "second_thread_ms": round(thread_ms, 4),
                         "main_again_ms": round(again_ms, 4),
                         "switches_per_s_main": round(main_rate),
                         "switches_per_s_second_thread": round(thread_rate)}
        best_main = min(main_ms, again_ms)
        rows.append((f"{name}: main thread / a second thread",
                     f"{best_main:.3f} ms / {thread_ms:.3f} ms ({thread_ms / best_main:.2f}x); "
                     f"context switches {main_rate:.0f}/s vs {thread_rate:.0f}/s"))
    results["threads"] = torch.get_num_threads()
    return rows, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the repeats")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows, results = measure(0.1 if args.quick else 1.0)
    report("One computing thread or two (PyTorch on a CPU)", rows, {"threads": results},
           args.json)


if __name__ == "__main__":
    main()
