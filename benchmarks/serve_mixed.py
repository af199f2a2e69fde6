"""A mixed serving workload (``python -m benchmarks.serve --parts mixed``).

One ``vaswani serve`` holds a translator (the bible preset's size) and a language model (the
shakespeare-char preset's size with ``max_len`` 512), both with effectively random weights
(one training step), so every answer runs to its length: ``min_tokens`` = ``max_tokens`` for
completions, the length cap for translations. Measured, in each of the rounds (a fresh
server each; the round with more tokens/s kept, every round's figures in brief beside it):

1. throughput: 32 clients, each sending requests back to back from one seeded list:
   completions (prompts of 5-200 tokens, ``max_tokens`` 8-256, half streamed) and
   translations (beam 4); completion tokens per second over the whole run, and the median
   time to the first streamed token;
2. the first token alone: one client streaming the same kind of completions, median time to
   its first token;
3. a short request among long ones: 31 clients stream 256-token completions (read by one
   thread with asyncio over raw sockets, :class:`Streams`, so that the load takes little of
   the server's cores); once they run, 8-token requests, one after another (after the
   first, only while all 31 still run; up to 5); their median time against the median of
   the same request on an idle server.

And once, in this process (``engine_alone``): the short request among long ones on the
engine itself, stepped here with no server around it, to tell the engine's share of that
ratio from the server's (HTTP, streaming, and the clients, on the same cores).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from .common import ONE_STEP, ROOT, VASWANI, ServeProcess, train

LETTERS = "abcdefghijklmnopqrstuvwxyz ,.\n"


def make_lm(work: Path, text: Path) -> Path:
    """The shakespeare-char preset's model with max_len 512, trained one step on ``text``."""
    run = work / "lm512"
    if not (run / "model.safetensors").exists():
        train([*VASWANI, "train", str(ROOT / "configs" / "shakespeare-char.toml"),
               "--out", str(run), "--set", "data.dataset=", "--set", f"data.train={text}",
               "--set", f"data.valid={text}", "--set", "model.max_len=512", *ONE_STEP,
               "--cache", str(work / "cache")])
    return run


class Served(ServeProcess):
    """``vaswani serve`` of ``runs`` ({name: dir})."""

    def __init__(self, runs: dict[str, Path], max_batch: int) -> None:
        names = [a for name in runs for a in ("--name", name)]
        super().__init__([*map(str, runs.values()), *names, "--max-batch", str(max_batch),
                          "--max-queue", "1024"], start_s=180)


def workload(sentences: list[str], clients: int, per_client: int, seed: int = 0) -> list:
    """Each client's requests: ("complete", prompt, max_tokens, stream) or ("translate",
    sentence)."""
    rng = random.Random(seed)
    out = []
    for _ in range(clients):
        mine = []
        for _ in range(per_client):
            if rng.random() < 0.75:
                prompt = "".join(rng.choice(LETTERS) for _ in range(rng.randint(5, 200)))
                mine.append(("complete", prompt, rng.randint(8, 256), rng.random() < 0.5))
            else:
                mine.append(("translate", rng.choice(sentences)))
        out.append(mine)
    return out


SHORT = ("to be or not to be", 8)  # the short request among long ones: prompt, tokens
LONG = ("x" * 100, 256)


def completion_body(prompt: str, tokens: int, stream: bool) -> dict:
    """A completion of exactly ``tokens`` tokens (random weights would end some early)."""
    return {"model": "lm", "prompt": prompt, "max_tokens": tokens, "min_tokens": tokens,
            "temperature": 0.8, "seed": 1, "stream": stream}


def send(http: httpx.Client, request: tuple) -> dict:
    """One request; returns its kind, seconds, completion tokens and (streamed) time to the
    first piece of text."""
    start = time.perf_counter()
    if request[0] == "translate":
        r = http.post("/v1/translate", json={"model": "bible", "input": request[1], "beam": 4})
        r.raise_for_status()
        return {"kind": "translate", "seconds": time.perf_counter() - start, "tokens": 0}
    _, prompt, tokens, stream = request
    body = completion_body(prompt, tokens, stream)
    first = None
    if stream:
        with http.stream("POST", "/v1/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {") and first is None and \
                        json.loads(line[6:])["choices"][0]["text"]:
                    first = time.perf_counter() - start
    else:
        r = http.post("/v1/completions", json=body)
        r.raise_for_status()
        assert r.json()["usage"]["completion_tokens"] == tokens
    return {"kind": "complete", "seconds": time.perf_counter() - start, "tokens": tokens,
            "first": first}


def throughput(url: str, plan: list) -> dict:
    records, lock = [], threading.Lock()

    def client(mine: list) -> None:
        with httpx.Client(base_url=url, timeout=900) as http:
            for request in mine:
                record = send(http, request)
                with lock:
                    records.append(record)

    start = time.perf_counter()
    with ThreadPoolExecutor(len(plan)) as pool:
        list(pool.map(client, plan))
    wall = time.perf_counter() - start
    firsts = [r["first"] for r in records if r.get("first") is not None]
    tokens = sum(r["tokens"] for r in records)
    return {"requests": len(records), "seconds": round(wall, 1),
            "tokens_per_s": round(tokens / wall, 1),
            "first_token_p50_s": round(statistics.median(firsts), 3)}


def first_token_alone(url: str, plan: list) -> float:
    """One client, the streamed completions of the plan's first client, one at a time."""
    streamed = [r for mine in plan for r in mine if r[0] == "complete" and r[3]][:6]
    with httpx.Client(base_url=url, timeout=900) as http:
        send(http, ("complete", "warm up", 4, True))
        return round(statistics.median(send(http, r)["first"] for r in streamed), 3)


class Streams:
    """``n`` streamed completions (``body``) read to their end in one thread of their own, by
    asyncio over raw sockets: load that takes little of the cores it shares with the server.
    (31 httpx clients in threads took 1.3 CPU-seconds of a 4-second run of 256-token
    streams; these take 0.2.)"""

    def __init__(self, url: str, body: dict, n: int) -> None:
        where, data = urlsplit(url), json.dumps(body)
        self.request = (f"POST /v1/completions HTTP/1.1\r\nHost: {where.hostname}\r\n"
                        "Content-Type: application/json\r\nConnection: close\r\n"
                        f"Content-Length: {len(data)}\r\n\r\n{data}").encode()
        self.where, self.n, self.done = where, n, 0
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=asyncio.run, args=(self._all(),), daemon=True)

    async def _all(self) -> None:
        await asyncio.gather(*(self._one() for _ in range(self.n)))

    async def _one(self) -> None:
        try:
            reader, writer = await asyncio.open_connection(self.where.hostname, self.where.port)
            writer.write(self.request)
            head = await reader.readline()
            assert head.split()[1] == b"200", head
            tail = b""
            while chunk := await reader.read(1 << 16):
                tail = (tail + chunk)[-64:]
            writer.close()
            assert b"data: [DONE]" in tail, tail  # the stream ran to its end
        except BaseException as e:  # noqa: BLE001 - raised again by wait()
            self.errors.append(e)
        self.done += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.thread.join()  # no stream is left running

    def running(self) -> int:
        return self.n - self.done

    def wait(self) -> None:
        self.thread.join()
        if self.errors:
            raise self.errors[0]


def engine_side(http: httpx.Client, model: str = "lm") -> tuple[float, float, float] | None:
    """From the server's /metrics: the sums of its requests' times to the first token and
    per later token, and how many requests they cover (None: a server without /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    r = http.get("/metrics")
    if r.status_code != 200:
        return None
    sums = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.labels.get("model") == model and sample.name.endswith(("_sum", "_count")):
                sums[sample.name] = sample.value
    first, per = "vaswani_time_to_first_token_seconds", "vaswani_time_per_output_token_seconds"
    # (no request of the model finished yet: no samples)
    return tuple(sums.get(name, 0.0) for name in (first + "_sum", per + "_sum", first + "_count"))


def _means(before, after) -> tuple[float, float] | None:
    """The mean time to the first token and per later token of the requests finished
    between two :func:`engine_side` readings (None: no reading, or none finished)."""
    if before is None or after is None or after[2] == before[2]:
        return None
    n = after[2] - before[2]
    return (after[0] - before[0]) / n, (after[1] - before[1]) / n


def engine_time(before, after, tokens: int) -> float | None:
    """The mean time from the server's making a request to its last token (the engines'
    queue and steps) of the requests finished between two :func:`engine_side` readings,
    each of ``tokens`` tokens."""
    means = _means(before, after)
    return None if means is None else round(means[0] + (tokens - 1) * means[1], 4)


def per_token_time(before, after) -> float | None:
    """The mean time per token after the first (about one engine step each) of the requests
    finished between two :func:`engine_side` readings."""
    means = _means(before, after)
    return None if means is None else round(means[1], 5)


def short_among_long(url: str, clients: int = 31, repeats: int = 5) -> dict:
    """Also, where the server has /metrics, the short requests' time in the engine (from
    the server's making the request to its last token: the engines' queue and steps) and per
    token after the first, alone and among the long ones; the rest of their time is HTTP's
    and the server thread's."""
    short = ("complete", *SHORT, False)
    with httpx.Client(base_url=url, timeout=900) as http:
        send(http, short)  # warm-up
        solo = [engine_side(http)]
        alone = statistics.median(send(http, short)["seconds"] for _ in range(repeats))
        solo.append(engine_side(http))
        with Streams(url, completion_body(*LONG, stream=True), clients) as longs:
            time.sleep(1.5)  # the long ones are running
            among = [engine_side(http)]
            # the first, then more while all the long ones still run (dynamic batching
            # answers the first only after its batch, and the long ones are gone by the second)
            times = [send(http, short)["seconds"]]
            while len(times) < repeats and longs.running() == clients:
                times.append(send(http, short)["seconds"])
            among.append(engine_side(http))
            loaded = statistics.median(times)
            longs_left = longs.running()
            longs.wait()
    out = {"alone_s": round(alone, 3), "among_long_s": round(loaded, 3),
           "ratio": round(loaded / alone, 2), "requests_among_long": len(times),
           "long_ones_still_running": longs_left}
    engine_alone = engine_time(*solo, SHORT[1])
    if engine_alone is not None and longs_left == clients:  # no long one in the readings
        out["in_engine_s"] = {"alone": engine_alone,
                              "among_long": engine_time(*among, SHORT[1]),
                              "per_token_alone": per_token_time(*solo),
                              "per_token_among_long": per_token_time(*among)}
    return out


def engine_short_among_long(lm: Path, clients: int = 31, repeats: int = 5,
                            max_batch: int = 32) -> dict:
    """:func:`short_among_long` in this process, on the engine alone: the same requests,
    stepped here, with no HTTP, no streaming and no clients sharing the cores. What the
    engine's steps cost, apart from the server's work around them."""
    from vaswani.engine import EngineConfig
    from vaswani.inference import load

    run = load(lm)
    engine = run.new_engine(EngineConfig(max_rows=max_batch))

    def request(prompt: str, tokens: int):
        decode = run.decode_options(max_new_tokens=tokens, min_length=tokens, temperature=0.8)
        return engine.submit(run.completion(prompt, decode, seed=1).request)

    def short() -> tuple[float, float]:
        """Its time, and its time per token after the first (about one step each)."""
        start, r = time.perf_counter(), request(*SHORT)
        while r.finished is None:
            engine.step()
        assert len(r.output) == SHORT[1]
        return time.perf_counter() - start, (r.finished - r.first_token) / (SHORT[1] - 1)

    short()  # warm-up
    solo = [short() for _ in range(repeats)]
    longs = [request(*LONG) for _ in range(clients)]
    while any(r.first_token is None for r in longs):  # the long ones are running
        engine.step()
    among = [short() for _ in range(repeats)]
    assert all(r.finished is None for r in longs)  # all along, among all 31
    for r in longs:
        r.cancel()
    while engine.busy:
        engine.step()
    alone, loaded = (statistics.median(t for t, _ in x) for x in (solo, among))
    # unrounded: a ratio recomputed from times rounded to 0.1 ms is off by a few hundredths
    return {"alone_s": alone, "among_long_s": loaded, "ratio": loaded / alone,
            "per_token_alone_s": statistics.median(p for _, p in solo),
            "per_token_among_long_s": statistics.median(p for _, p in among)}


def measure(runs: dict[str, Path], plan: list, max_batch: int) -> dict:
    with Served(runs, max_batch) as server:
        send(httpx.Client(base_url=server.url, timeout=300), ("translate", "Warm up."))
        out = throughput(server.url, plan)
        out["first_token_alone_s"] = first_token_alone(server.url, plan)
        out["short_among_long"] = short_among_long(server.url)
    return out


def in_brief(out: dict) -> dict:
    """A round's figures that vary from one server process to the next: its tokens/s, and
    the first token's and the short request's times under load and alone."""
    short = out["short_among_long"]
    return {"tokens_per_s": out["tokens_per_s"],
            "first_token_s": [out["first_token_p50_s"], out["first_token_alone_s"]],
            "short_s": [short["among_long_s"], short["alone_s"]], "short_ratio": short["ratio"]}


def run(work: Path, translator: Path, text: Path, sentences: list[str], rounds: int,
        per_client: int) -> dict:
    """The mixed workload's figures: {"engine": the best round's (with every round's in
    brief), "engine_alone": the short request among long ones on the engine itself}."""
    runs = {"bible": translator, "lm": make_lm(work, text)}
    plan = workload(sentences, 32, per_client)
    best, every = None, []
    for _ in range(rounds):
        out = measure(runs, plan, max_batch=32)
        print(f"mixed: {out}", flush=True)
        every.append(in_brief(out))
        if best is None or out["tokens_per_s"] > best["tokens_per_s"]:
            best = out
    best["rounds"] = every
    best["first_token_loaded_over_alone"] = round(best["first_token_p50_s"]
                                                  / best["first_token_alone_s"], 2)
    fastest = min(  # the faster round among the long ones, as the best time elsewhere,
        (engine_short_among_long(runs["lm"]) for _ in range(rounds)),  # not the better ratio
        key=lambda r: r["among_long_s"])
    alone = {"short_among_long": {k: round(v, 5 if k.startswith("per_token") else 4 if
                                           k.endswith("_s") else 2) for k, v in fastest.items()}}
    return {"engine": best, "engine_alone": alone}
