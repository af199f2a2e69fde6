"""Each decoding engine in a process of its own, driven the way its own users drive it.

    python -m benchmarks.peers JOB.json OUT.json     (what :func:`race` runs; not by hand)

Why a process each: torch, CTranslate2 and ONNX Runtime each bring an OpenMP runtime, and on
2 cores two of them in one process slow each other (CTranslate2 translating the demo model ran
at 60-77 sentences/s after torch had run in the same process, 185-190 alone). This module
imports nothing but the standard library at the top; each engine's child imports only that
engine (the CTranslate2 and ONNX Runtime children check that torch is not loaded).

How each engine is called:

- ``vaswani``: ``vaswani.load(RUN).translate(texts, ...)`` / ``generate_many(prompts, ...)``,
  the library's own call, with its defaults (what ``vaswani translate`` runs; a translation
  also split across worker processes, ``workers``: :func:`vaswani_workers`), in a process
  under the malloc settings every ``vaswani`` command runs under (cli/process.py
  ``keep_freed_memory``; ``malloc_pinned`` in the result says whether they took); ``quantize``
  and ``compiled`` as ``vaswani.load`` takes them (eager unless ``compiled``: the decode step
  ``vaswani compile`` built into the run).
- ``ctranslate2``: one ``translate_batch`` (``generate_batch``) call over every input, with
  CTranslate2's own batching and sorting (``max_batch_size``, ``batch_type``: the settings
  given, default 1,024 tokens as its documentation suggests for throughput; the benchmarks
  race it at each of :data:`CT2_BATCHINGS` and keep its fastest), on each of its two CPU
  backends (:data:`CT2_BACKENDS`: Intel MKL or oneDNN, which CTranslate2 picks by the CPU's
  vendor unless ``CT2_USE_MKL`` says; the faster kept), with the threads given to one
  worker (``intra_threads``) or split among workers that run batches side by side
  (``inter_threads``; :func:`workers_for`: both raced), and the options the export's
  README gives (``vaswani export --format ct2`` writes it): ``min_decoding_length=0``,
  ``suppress_sequences`` of ``<pad>``/``<bos>``, one ``max_decoding_length``. Tokens come
  from the ``tokenizers`` library (or, for a character tokenizer, the characters), as a
  CTranslate2 user's own tokenizer would give them.
- ``onnxruntime``: greedy decoding in numpy over ``encoder.onnx`` / ``decoder.onnx`` of
  ``vaswani export --format onnx`` (ONNX Runtime has no search of its own), the whole input
  one padded batch, ``intra_op_num_threads`` = the threads given.

Each child loads its model, warms up on the first 16 inputs, then times passes over all of
them, text in and text out (tokenizing included), until 5 seconds are timed (1 to 5 passes),
and writes its outputs and its best pass's seconds.
:func:`race` runs the children in alternation (a, b, a, b, ...) so a change in the machine's
load hits every engine alike, keeps each engine's best time, and compares the outputs apart
from the timing; :func:`race_at_best` first picks each CTranslate2 row's fastest setting, then
races every engine for as many rounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 16  # inputs decoded before the timed passes (threads, allocations, first calls)
# a pass of under a second is at the mercy of a shared machine's noise (CTranslate2 over the
# demo's test verses: 0.7-1.0 s a pass, 1.4x apart between runs): short passes repeat
TIMED_SECONDS, MAX_PASSES = 5.0, 5


# --- the parent ------------------------------------------------------------------------------

def run_child(job: dict, timeout: float = 1800) -> dict:
    """Run one job in a fresh ``python -m benchmarks.peers`` process; its result dict."""
    with tempfile.TemporaryDirectory(prefix="vaswani-peer-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        proc = subprocess.run([sys.executable, "-m", "benchmarks.peers", str(job_path),
                               str(out_path)], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, **job.get("env", {})})
        if proc.returncode != 0:
            raise RuntimeError(f"the {job['engine']} child failed ({proc.returncode}):\n"
                               f"{proc.stderr[-3000:]}")
        return json.loads(out_path.read_text())


def race(jobs: dict[str, dict], rounds: int = 2) -> dict[str, dict]:
    """Each named job run ``rounds`` times, the jobs alternating; per name: its best seconds,
    every round's seconds, inputs per second at the best, its outputs and settings."""
    results: dict[str, dict] = {}
    for _ in range(rounds):
        for name, job in jobs.items():
            out = run_child(job)
            r = results.setdefault(name, {"rounds": [], "started": [],
                                          "settings": out["settings"]})
            r["rounds"].append(out["seconds"])
            r["started"].append(out["started"])
            r["outputs"] = out["outputs"]
    for r in results.values():
        r["seconds"] = min(r["rounds"])
        r["per_s"] = round(len(r["outputs"]) / r["seconds"], 1)
    return results


# CTranslate2's batch settings each CTranslate2 row is raced at: the 1,024 tokens its
# documentation suggests for throughput, a larger token budget and a fixed count of examples.
# Which is fastest depends on the model and the search (on the offline bench's small
# translator, 2-vCPU EPYC: 4,096 tokens for greedy, 64 examples for beam 4, each 10-40% above
# 1,024 tokens), so a row keeps the fastest, and the ratio is against CTranslate2 at its best.
CT2_BATCHINGS = {
    "1024 tokens": {"max_batch_size": 1024, "batch_type": "tokens"},
    "4096 tokens": {"max_batch_size": 4096, "batch_type": "tokens"},
    "64 examples": {"max_batch_size": 64, "batch_type": "examples"},
}


# CTranslate2's two CPU backends, chosen by the environment variable CT2_USE_MKL (by default
# it takes Intel MKL on an Intel CPU, oneDNN on others). Which is faster depends on the CPU
# (2-vCPU Intel Xeon with AMX, the demo model, greedy: MKL 177 sentences/s, oneDNN 740), so a
# row is raced on both.
CT2_BACKENDS = {"MKL": {"CT2_USE_MKL": "1"}, "oneDNN": {"CT2_USE_MKL": "0"}}


def workers_for(threads: int) -> tuple[int, ...]:
    """CTranslate2's ways to use ``threads`` cores a CTranslate2 row is raced at: one worker
    with every thread (``intra_threads``), and, on more than one core, a worker per core of
    one thread each (``inter_threads``), the batches run side by side, as its documentation
    ("Multithreading and parallelism") suggests for throughput on a CPU. Which is faster
    depends on the search: on the 2-vCPU Zen 4 EPYC, the demo translator's 300 test verses
    with beam 4 took 1.17-1.24 s with two workers, 1.34-1.45 s with one (2026-12-04)."""
    return (1, threads) if threads > 1 else (1,)


def batchings(name: str, job: dict, settings: dict = CT2_BATCHINGS,
              backends: dict = CT2_BACKENDS, workers: tuple[int, ...] | None = None
              ) -> dict[str, dict]:
    """``job`` once per batch setting, backend and number of workers (default
    :func:`workers_for` the job's threads), named ``name [setting, backend]`` (one worker) or
    ``name [setting, backend, N workers]``, for :func:`race`."""
    workers = workers_for(job["threads"]) if workers is None else workers
    return {f"{name} [{label}, {backend}{'' if n == 1 else f', {n} workers'}]": {
                **job, "batching": batching, "env": env, "backend": backend, "workers": n}
            for label, batching in settings.items() for backend, env in backends.items()
            for n in workers}


def vaswani_workers(name: str, job: dict, workers: tuple[int, ...] | None = None
                    ) -> dict[str, dict]:
    """A vaswani translation ``job`` once per number of processes its offline call is split
    across (``vaswani.load(..., workers=N)``, vaswani's own way to keep every core busy, as
    CTranslate2's ``inter_threads``; default :func:`workers_for` the job's threads), named
    ``name [1 worker]`` or ``name [N workers]``, for :func:`race_at_best`, which races
    CTranslate2's rows at both too."""
    workers = workers_for(job["threads"]) if workers is None else workers
    return {f"{name} [{n} worker{'s' if n > 1 else ''}]": {**job, "workers": n}
            for n in workers}


def keep_fastest(raced: dict[str, dict]) -> dict[str, dict]:
    """``raced`` with each group of ``name [setting]`` entries replaced by its fastest, under
    ``name``, that setting's label under ``"setting"``; the group's inputs per second at each
    setting kept under ``"tried"``."""
    out: dict[str, dict] = {}
    for key, r in raced.items():
        name, _, label = key.partition(" [")
        if not label:
            out[key] = r
            continue
        best = out.get(name)
        tried = {**(best or {}).get("tried", {}), label.rstrip("]"): r["per_s"]}
        if best is None or r["seconds"] < best["seconds"]:
            best = {**r, "setting": label.rstrip("]")}
        out[name] = {**best, "tried": tried}
    return out


def race_at_best(jobs: dict[str, dict], rounds: int = 2) -> dict[str, dict]:
    """:func:`race` where some contenders are groups of settings (``name [setting]`` jobs:
    :func:`batchings`), fair to all: a first race of one round picks each group's fastest
    setting, then every contender (single jobs, and each group at its setting) runs
    ``rounds`` rounds in alternation, so each one's best is a best of as many timed rounds.
    (A group's best over all its settings' rounds, CTranslate2's 12 against vaswani's 2,
    would be the luckiest of many on a noisy machine.) Each group's entry, under ``name``,
    keeps ``"setting"`` and the first race's figures (``"tried"``)."""
    grouped = {key: job for key, job in jobs.items() if " [" in key}
    picked = keep_fastest(race(grouped, rounds=1)) if grouped else {}
    final: dict[str, dict] = {}
    for key, job in jobs.items():
        name, _, label = key.partition(" [")
        if not label:
            final[key] = job
        elif name not in final:
            final[name] = grouped[f"{name} [{picked[name]['setting']}]"]
    raced = race(final, rounds)
    for name, first in picked.items():
        raced[name].update(setting=first["setting"], tried=first["tried"])
    return raced


def agreement(a: list, b: list) -> float:
    """The share of inputs whose outputs are the same."""
    return sum(x == y for x, y in zip(a, b, strict=True)) / max(1, len(a))


# --- the children ----------------------------------------------------------------------------

def _timed(fn, inputs: list) -> tuple[list, float]:
    """Warm up, then time whole passes over ``inputs`` until ``TIMED_SECONDS`` have been timed
    (at most ``MAX_PASSES``): the best pass's seconds, and the outputs (the same every pass)."""
    fn(inputs[:WARMUP])
    best, timed = float("inf"), 0.0
    for _ in range(MAX_PASSES):
        start = time.perf_counter()
        out = fn(inputs)
        seconds = time.perf_counter() - start
        best, timed = min(best, seconds), timed + seconds
        if timed >= TIMED_SECONDS:
            break
    return out, best


def _vaswani(job: dict) -> tuple[list, float, dict]:
    import torch

    import vaswani
    from vaswani.cli.process import keep_freed_memory

    pinned = keep_freed_memory()  # the malloc settings `vaswani translate` runs under
    torch.set_num_threads(job["threads"])
    run = vaswani.load(job["model"], quantize=job.get("quantize"),  # eager unless asked:
                       compiled=job.get("compiled", False),  # the run may hold a package
                       workers=job.get("workers", 1))  # (processes started here, untimed)
    if job.get("dtype") == "bf16":
        run.model.to(torch.bfloat16)
    opts = job["options"]
    if job["task"] == "translate":
        def fn(texts):
            return run.translate(texts, **opts)
    else:
        def fn(texts):
            return run.generate_many(texts, **opts)
    out, seconds = _timed(fn, job["inputs"])
    return out, seconds, {"threads": torch.get_num_threads(), "quantize": job.get("quantize"),
                          "workers": run.workers.count if run.workers else 1,
                          "malloc_pinned": pinned,  # this process's, then each worker's
                          "workers_malloc_pinned": run.workers.malloc_pinned if run.workers
                          else [],
                          "compiled": run.compiled is not None, **opts}


class _Tokenizer:
    """The run's tokenizer as a CTranslate2 or ONNX Runtime user has it: Hugging Face
    ``tokenizers`` for BPE, the characters for a character tokenizer (vaswani's JSON)."""

    SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")

    def __init__(self, folder: Path, side: str) -> None:
        meta = json.loads((folder / "meta.json").read_text())
        entry = meta.get(side) or meta["source"]
        path = folder / entry["file"]
        self.kind = entry["kind"]
        if self.kind == "char":
            self.itos = list(self.SPECIALS) + json.loads(path.read_text())["chars"]
            self.stoi = {c: i for i, c in enumerate(self.itos)}
        else:
            from tokenizers import Tokenizer

            self.hf = Tokenizer.from_file(str(path))

    def tokens(self, text: str) -> list[str]:
        if self.kind == "char":
            return [c if c in self.stoi else "<unk>" for c in text]
        return self.hf.encode(text).tokens

    def ids(self, text: str) -> list[int]:
        if self.kind == "char":
            return [self.stoi.get(c, 3) for c in text]
        return self.hf.encode(text).ids

    def text(self, tokens: list[str]) -> str:
        if self.kind == "char":
            return "".join(t for t in tokens if t not in self.SPECIALS)
        return self.hf.decode([self.hf.token_to_id(t) for t in tokens], skip_special_tokens=True)

    def text_of_ids(self, ids: list[int]) -> str:
        if self.kind == "char":
            return self.text([self.itos[i] for i in ids])
        return self.hf.decode(ids, skip_special_tokens=True)


def _no_torch(engine: str) -> None:
    if "torch" in sys.modules:
        raise RuntimeError(f"torch was imported in the {engine} child: its OpenMP runtime "
                           "would slow the engine measured")


def _ctranslate2(job: dict) -> tuple[list, float, dict]:
    import ctranslate2

    folder = Path(job["model"])
    src = _Tokenizer(folder / "vaswani" / "tokenizer", "source")
    tgt = _Tokenizer(folder / "vaswani" / "tokenizer", "target")
    workers = job.get("workers", 1)  # batches run side by side, each on its share of threads
    settings = {**CT2_BATCHINGS["1024 tokens"], **job.get("batching", {}),
                "inter_threads": workers, "intra_threads": max(1, job["threads"] // workers),
                "compute_type": job.get("compute_type", "default"),
                "backend": job.get("backend", "default"),
                "CT2_USE_MKL": os.environ.get("CT2_USE_MKL", "(unset)")}
    never = [["<pad>"], ["<bos>"]]
    opts = job["options"]
    if job["task"] == "translate":
        model = ctranslate2.Translator(str(folder), device="cpu", inter_threads=workers,
                                       intra_threads=settings["intra_threads"],
                                       compute_type=settings["compute_type"])

        def fn(texts):
            results = model.translate_batch(
                [src.tokens(t) for t in texts], max_batch_size=settings["max_batch_size"],
                batch_type=settings["batch_type"], beam_size=opts["beam_size"],
                length_penalty=opts.get("length_penalty", 1.0), min_decoding_length=0,
                max_decoding_length=opts["max_decoding_length"], suppress_sequences=never)
            return [tgt.text(r.hypotheses[0]) for r in results]
    else:
        model = ctranslate2.Generator(str(folder), device="cpu", inter_threads=workers,
                                      intra_threads=settings["intra_threads"],
                                      compute_type=settings["compute_type"])

        def fn(prompts):
            results = model.generate_batch(
                [src.tokens(p) or ["<bos>"] for p in prompts],
                max_batch_size=settings["max_batch_size"], batch_type=settings["batch_type"],
                max_length=opts["max_length"], sampling_topk=1, end_token="<eos>",
                include_prompt_in_result=False, suppress_sequences=never)
            return [tgt.text(r.sequences[0]) for r in results]
    _no_torch("ctranslate2")
    out, seconds = _timed(fn, job["inputs"])
    _no_torch("ctranslate2")
    return out, seconds, {**settings, **opts}


def _onnxruntime(job: dict) -> tuple[list, float, dict]:
    import tomllib

    import numpy as np
    import onnxruntime

    folder = Path(job["model"])
    config = tomllib.loads((folder / "vaswani" / "config.toml").read_text())
    src = _Tokenizer(folder / "vaswani" / "tokenizer", "source")
    tgt = _Tokenizer(folder / "vaswani" / "tokenizer", "target")
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = job["threads"]
    sessions = [onnxruntime.InferenceSession(str(folder / name), opts,
                                             providers=["CPUExecutionProvider"])
                for name in ("encoder.onnx", "decoder.onnx")]
    max_len, pad = config["model"]["max_len"], config["model"]["pad_id"]
    a, b = config["decode"]["max_len_a"], config["decode"]["max_len_b"]
    a, b = job["options"].get("max_len_a", a), job["options"].get("max_len_b", b)
    BOS, EOS = 1, 2

    def fn(texts):  # greedy, the whole input one padded batch, as vaswani would decode it
        rows = [src.ids(t)[:max_len - 1] + [EOS] for t in texts]
        ids = np.full((len(rows), max(map(len, rows))), pad, dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
        keep = ids != pad
        memory = sessions[0].run(None, {"input_ids": ids, "attention_mask": keep})[0]
        limit = np.array([min(max_len - 1, int(a * len(r) + b)) for r in rows])
        out = np.full((len(rows), 1), BOS, dtype=np.int64)
        done = np.zeros(len(rows), dtype=bool)
        for step in range(int(limit.max())):
            logits = sessions[1].run(None, {"decoder_input_ids": out, "memory": memory,
                                            "attention_mask": keep})[0][:, -1]
            logits[:, [pad, BOS]] = -np.inf
            nxt = np.where(done, pad, logits.argmax(-1))
            done |= nxt == EOS
            out = np.concatenate([out, nxt[:, None]], 1)
            done |= step + 1 >= limit
            if done.all():
                break
        texts_out = []
        for row in out[:, 1:].tolist():
            end = next((i for i, t in enumerate(row) if t in (EOS, pad)), len(row))
            texts_out.append(tgt.text_of_ids(row[:end]))
        return texts_out

    _no_torch("onnxruntime")
    out, seconds = _timed(fn, job["inputs"])
    return out, seconds, {"intra_op_num_threads": job["threads"], "search": "greedy"}


ENGINES = {"vaswani": _vaswani, "ctranslate2": _ctranslate2, "onnxruntime": _onnxruntime}


def main() -> None:
    job_path, out_path = sys.argv[1:3]
    job = json.loads(Path(job_path).read_text())
    started = time.time()
    outputs, seconds, settings = ENGINES[job["engine"]](job)
    Path(out_path).write_text(json.dumps({"outputs": outputs, "seconds": seconds,
                                          "settings": settings, "started": started}))


if __name__ == "__main__":
    main()
