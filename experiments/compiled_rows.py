"""A language model's decode step of many rows, compiled and eager: whether a package
should take steps of every size (engine/compiled.py ``ROWS``), or hand the largest back to
the eager step.

    python -m experiments.compiled_rows RUN_DIR [--quantize int8|int4] [--rows 64,256,312]
                                        [--rounds 3] [--json OUT.json]

For each number of rows R: an offline engine of R rows (the one ``generate_many`` makes,
``cache_bytes`` raised so that R full-length rows fit), R prompts (12 words each, taken in
turn from benchmarks/texts/held-out.md) prefilled and decoded 3 steps (rows of unlike
contexts), then the step due timed with the run's package (built first by ``vaswani compile
RUN_DIR [--quantize ...]``) and eagerly, the cache put back before each call, alternating,
``--rounds`` times; each one's best and median, and the largest difference of their logits
(int8's products are float32 in the package and bfloat16 in eager's kernel: bfloat16's steps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

HELD_OUT = Path(__file__).resolve().parents[1] / "benchmarks" / "texts" / "held-out.md"


def prompts(n: int, words: int = 12) -> list[str]:
    text = HELD_OUT.read_text().split()
    return [" ".join(text[i * 7 % (len(text) - words):][:words]) for i in range(n)]


def time_rows(run, R: int, rounds: int) -> dict:
    """The step due after R prompts, compiled and eager (see the module)."""
    from vaswani.engine import EngineConfig, Params, Request

    c = run.model.config  # a position's keys and values, float32, every layer
    per_token = 2 * c.n_decoder_layers * c.n_kv_heads * c.head_dim * 4
    engine = run.new_engine(EngineConfig.offline(
        R, cache_bytes=max(1 << 30, 2 * R * c.max_len * per_token)))
    for p in prompts(R):
        engine.submit(Request(run.source_tokenizer.encode(p), Params(max_new_tokens=30)))
    for _ in range(4):  # the prefills, then decoding steps
        engine.step()
    rows = engine.scheduler.plan().decode
    saved = [t.clone() for t in (*engine.cache.k, *engine.cache.v)]
    package = engine.runner.compiled

    def step(compiled) -> tuple[float, torch.Tensor]:
        with torch.inference_mode():
            for t, s in zip((*engine.cache.k, *engine.cache.v), saved, strict=True):
                t.copy_(s)
        engine.runner.compiled = compiled
        start = time.perf_counter()
        logits, at = engine.runner.decode(rows)
        return time.perf_counter() - start, logits[at]

    times: dict[str, list[float]] = {"compiled": [], "eager": []}
    for _ in range(rounds):
        for name, compiled in (("compiled", package), ("eager", None)):
            times[name].append(step(compiled)[0])
    difference = (step(package)[1] - step(None)[1]).abs().max().item()
    engine.runner.compiled = package
    best = {name: min(t) * 1e3 for name, t in times.items()}
    return {"rows": len(rows), "compiled_ms": round(best["compiled"], 2),
            "eager_ms": round(best["eager"], 2),
            "median_ms": {name: round(statistics.median(t) * 1e3, 2) for name, t in times.items()},
            "eager_over_compiled": round(best["eager"] / best["compiled"], 2),
            "largest_logit_difference": difference}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--quantize", choices=["int8", "int4"])
    parser.add_argument("--rows", default="64,256,312", help="rows of the steps timed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)

    import vaswani
    from benchmarks.common import hardware
    from vaswani.cli.process import keep_freed_memory

    keep_freed_memory()  # the malloc settings `vaswani generate` runs under
    run = vaswani.load(args.run_dir, quantize=args.quantize, compiled=True)
    if run.config.model.arch == "encoder-decoder":
        raise SystemExit(f"{args.run_dir} holds a translator: this experiment times a "
                         "language model's steps")
    result = {"run_dir": args.run_dir, "quantize": args.quantize, "rounds": args.rounds,
              "steps": [], "hardware": hardware()}
    for R in (int(r) for r in args.rows.split(",")):
        one = time_rows(run, R, args.rounds)
        result["steps"].append(one)
        print(f"{one['rows']} rows: compiled {one['compiled_ms']} ms, eager "
              f"{one['eager_ms']} ms ({one['eager_over_compiled']}x), logits within "
              f"{one['largest_logit_difference']:.2g}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
