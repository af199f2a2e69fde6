"""A translator's compiled step with and without each of its two companion packages
(engine/compiled.py): the step for a few rows (``FEW_GEMM``) and the encoder pass
(``EncodeStep``), and with its runs of rows reading their own keys as far as the step's
longest row instead of their own longest's (``CompiledStep.own_widths``): what each buys a
whole translation.

    python -m experiments.companions RUN_DIR [--limit 300] [--rounds 5] [--json OUT.json]

The run's packages are built first (``vaswani compile RUN_DIR``). Four jobs, each timed
four ways, in turn, ``--rounds`` times after a warm-up round: with both companions, without
the few-row step (``few_rows`` 0: every step the step's own package), without the encoder
pass (sources encoded eagerly), and with both but every run of rows reading its own keys as
far as the step's longest row. The jobs: the first ``--limit`` test sentences greedily and
with beam 4 (as ``benchmarks.export`` translates them: no length penalty, capped at
``max_len - 1`` tokens), and the one of them with the longest translation alone, greedily and
with beam 4 (a sentence typed at ``vaswani translate``: every step a few rows). Each way's
best and median, its best over the best with both, and whether every way gave the same
translations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

WAYS = ("with both", "without the few-row step", "without the encoder pass",
        "own keys at the step's width")


def time_jobs(run, sources: list[str], rounds: int) -> dict:
    """Each job's seconds each way (see the module)."""
    step = run.compiled
    few_rows, encoder = step.few_rows, step.encoder
    settings = {"with both": (few_rows, encoder, True),
                "without the few-row step": (0, encoder, True),
                "without the encoder pass": (few_rows, None, True),
                "own keys at the step's width": (few_rows, encoder, False)}
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
            times: dict[str, list[float]] = {way: [] for way in WAYS}
            outputs = {}
            for i in range(rounds + 1):
                for way in WAYS:
                    step.few_rows, step.encoder, own = settings[way]
                    own_widths(step, own)
                    start = time.perf_counter()
                    outputs[way] = run.translate(texts, beam=beam, **options)
                    if i:  # the first round warms each up
                        times[way].append(time.perf_counter() - start)
            best = {way: min(t) for way, t in times.items()}
            result[job] = {
                "sentences": len(texts), "beam": beam,
                "best_s": {way: round(b, 4) for way, b in best.items()},
                "median_s": {way: round(statistics.median(t), 4) for way, t in times.items()},
                "over_with_both": {way: round(b / best["with both"], 2)
                                   for way, b in best.items()},
                "same_translations": all(o == outputs["with both"] for o in outputs.values())}
    finally:
        step.few_rows, step.encoder = few_rows, encoder
        own_widths(step, True)
    return result


def own_widths(step, on: bool) -> None:
    """``CompiledStep.own_widths`` of the step and of its few-row companion, which takes
    the steps of a few rows with its own."""
    for package in filter(None, (step, step.few)):
        package.own_widths = on


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
    if run.compiled.few is None or run.compiled.encoder is None:
        raise SystemExit(f"{args.run_dir}'s compiled step lacks a companion (a language "
                         f"model's has none, one built before 2026-12-04 neither, and a build "
                         f"that found the few-row step faster at no size kept none): "
                         f"`vaswani compile {args.run_dir}` builds them for a translator")
    pairs = list(iter_translation(run.data_files("test", default_cache()), ReadReport()))
    sources = [s for s, _ in pairs[:args.limit]]
    result = {"run_dir": args.run_dir, "sentences": len(sources), "rounds": args.rounds,
              "few_rows": run.compiled.few_rows, "jobs": time_jobs(run, sources, args.rounds),
              "hardware": hardware()}
    for job, one in result["jobs"].items():
        print(f"{job}: " + ", ".join(f"{way} {one['best_s'][way]} s" for way in WAYS)
              + f"; same translations: {one['same_translations']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
