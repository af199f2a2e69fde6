"""A translator's compiled step with and without its companion for steps of a few rows
(engine/compiled.py ``FEW_GEMM``): what the companion buys a whole translation.

    python -m experiments.few_rows RUN_DIR [--limit 300] [--rounds 5] [--json OUT.json]

The run's packages are built first (``vaswani compile RUN_DIR``). Three jobs, each timed
with the companion taking the steps it was kept for and with ``few_rows`` 0 (every step the
step's own package), the two in turn, ``--rounds`` times after a warm-up round: the first
``--limit`` test sentences greedily and with beam 4 (as ``benchmarks.export`` translates
them: no length penalty, capped at ``max_len - 1`` tokens), and the one of them with the
longest translation alone, greedily and with beam 4 (a sentence typed at ``vaswani
translate``: every step a few rows). Each one's best and median, and whether the two gave
the same translations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def time_jobs(run, sources: list[str], rounds: int) -> dict:
    """Each job's seconds with and without the companion (see the module)."""
    step = run.compiled
    kept = step.few_rows
    cap = run.config.model.max_len - 1
    options = dict(length_penalty=0.0, max_len_a=0.0, max_len_b=cap)
    greedy = run.translate(sources, beam=1, **options)
    longest = max(range(len(sources)), key=lambda i: len(greedy[i]))
    jobs = {"all, greedy": (sources, 1), "all, beam 4": (sources, 4),
            "longest alone, greedy": ([sources[longest]], 1),
            "longest alone, beam 4": ([sources[longest]], 4)}
    result = {}
    try:
        for job, (texts, beam) in jobs.items():
            times: dict[str, list[float]] = {"with": [], "without": []}
            outputs = {}
            for i in range(rounds + 1):
                for name, rows in (("with", kept), ("without", 0)):
                    step.few_rows = rows
                    start = time.perf_counter()
                    outputs[name] = run.translate(texts, beam=beam, **options)
                    if i:  # the first round warms both up
                        times[name].append(time.perf_counter() - start)
            best = {name: min(t) for name, t in times.items()}
            result[job] = {
                "sentences": len(texts), "beam": beam,
                "with_s": round(best["with"], 4), "without_s": round(best["without"], 4),
                "median_s": {name: round(statistics.median(t), 4) for name, t in times.items()},
                "without_over_with": round(best["without"] / best["with"], 2),
                "same_translations": outputs["with"] == outputs["without"]}
    finally:
        step.few_rows = kept
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--limit", type=int, default=300, help="the first N test sentences")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)

    import vaswani
    from benchmarks.common import hardware
    from vaswani.cli.process import keep_freed_memory
    from vaswani.data.files import ReadReport, iter_translation
    from vaswani.data.registry import default_cache

    keep_freed_memory()  # the malloc settings `vaswani translate` runs under
    run = vaswani.load(args.run_dir, compiled=True)
    if run.compiled.few is None:
        raise SystemExit(f"{args.run_dir}'s compiled step has no companion for a few rows "
                         f"(a language model's, one built before there were any, or one "
                         f"whose build found it faster at no size): `vaswani compile "
                         f"{args.run_dir}` builds it for a translator")
    pairs = list(iter_translation(run.data_files("test", default_cache()), ReadReport()))
    sources = [s for s, _ in pairs[:args.limit]]
    result = {"run_dir": args.run_dir, "sentences": len(sources), "rounds": args.rounds,
              "few_rows": run.compiled.few_rows, "jobs": time_jobs(run, sources, args.rounds),
              "hardware": hardware()}
    for job, one in result["jobs"].items():
        print(f"{job}: {one['with_s']} s with the few-row step, {one['without_s']} s without "
              f"({one['without_over_with']}x), same translations: {one['same_translations']}",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
