"""The server's state and its model work: the loaded runs and their workers, the limits a
request must keep, the errors it answers with, and the batched generation of completions
(the routes are app.py's)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import torch

from ..generation import generate, generate_batch
from ..inference import Run
from ..inference.base import owner_of
from ..inference.language_model import TextStream
from . import schemas
from .workers import Busy, Job, Worker

# What each route asks of a run: the method of the use class that serves it.
METHOD_OF_ROUTE = {"completions": "generate", "chat": "generate", "translate": "translate",
                   "classify": "classify", "embeddings": "embed"}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; past these it gets a 400 that names the limit."""

    max_input_chars: int = 20_000  # per text
    max_items: int = schemas.MAX_ITEMS  # texts or prompts per request
    max_tokens: int = 2048  # tokens generated per completion
    max_n: int = 8  # completions per prompt
    max_attention_tokens: int = 256  # tokens of the input (and target) of /v1/attention


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None):
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


class Server:
    """The loaded runs, their workers and the limits."""

    def __init__(self, runs: dict[str, Run], *, max_batch: int, max_wait_ms: float,
                 max_queue: int, limits: Limits) -> None:
        self.runs, self.limits = runs, limits
        self.workers = {name: Worker(name, self._handlers(run), max_batch=max_batch,
                                     max_wait_ms=max_wait_ms, max_queue=max_queue)
                        for name, run in runs.items()}
        self.started = int(time.time())

    def run_for(self, name: str, route: str) -> Run:
        if name not in self.runs:
            raise ApiError(404, f"unknown model {name!r}; loaded: {', '.join(self.runs)}",
                           "model", "not_found_error")
        run = self.runs[name]
        method = METHOD_OF_ROUTE.get(route)
        if method is not None and not callable(getattr(type(run), method, None)):
            raise ApiError(400, f"model {name!r} is {run.describes}; /v1/{route} needs "
                           f"{owner_of(method).describes}", "model")
        return run

    async def submit(self, name: str, kind: str, key: tuple, payload: dict, *,
                     stream: bool = False) -> Job:
        loop = asyncio.get_running_loop()
        job = Job(kind, key, payload, loop=loop, future=loop.create_future(),
                  events=asyncio.Queue() if stream else None)
        try:
            self.workers[name].submit(job)
        except Busy as e:
            raise ApiError(503, str(e), kind="server_busy") from None
        return job

    # --- model work (in the worker threads) --------------------------------------------
    def _handlers(self, run: Run) -> dict:
        return {
            "translate": lambda jobs: _split(jobs, run.translations(
                [t for j in jobs for t in j.payload["texts"]], jobs[0].payload["decode"])),
            "classify": lambda jobs: _split(jobs, run.probabilities(
                [t for j in jobs for t in j.payload["texts"]])),
            "embed": lambda jobs: _split(jobs, list(run.embed(
                [t for j in jobs for t in j.payload["texts"]]))),
            "generate": lambda jobs: generate_jobs(run, jobs),
            "attention": lambda jobs: [run.attention_view(**jobs[0].payload)],
        }

    def close(self) -> None:
        for worker in self.workers.values():
            worker.stop()


def _split(jobs: list[Job], results: list) -> list:
    out, start = [], 0
    for job in jobs:
        n = len(job.payload["texts"])
        out.append(results[start: start + n])
        start += n
    return out


def generate_jobs(run: Run, jobs: list[Job]) -> list[dict]:
    """Completions for every row of every job (a job has ``n`` rows per prompt), in one batch
    when they fit in the model's context, else one row at a time (a sliding window)."""
    tok = run.source_tokenizer
    rows = [(j, i, row) for j in jobs for i, row in enumerate(j.payload["rows"])]
    streams = [TextStream(tok, row["stop"]) for _, _, row in rows]
    count = [0] * len(rows)
    reason: list[str | None] = [None] * len(rows)
    rules = jobs[0].payload["rules"]

    def step(k: int, token: int) -> bool:
        """Row k got ``token``; True when the row is finished."""
        job, index, row = rows[k]
        if reason[k] is not None:
            return True
        count[k] += 1
        if token == tok.eos_id:
            reason[k] = "stop"
        else:
            piece = streams[k].push(token)
            if piece:
                job.emit("text", (index, piece))
            if streams[k].stopped:
                reason[k] = "stop"
        if reason[k] is None and count[k] >= row["max_new_tokens"]:
            reason[k] = "length"
        if job.cancelled:
            reason[k] = reason[k] or "cancelled"
        return reason[k] is not None

    fits = all(len(row["ids"]) + row["max_new_tokens"] <= run.config.model.max_len
               for _, _, row in rows)
    if fits:
        generate_batch(run.model, [row["ids"] for _, _, row in rows],
                       max_new_tokens=[row["max_new_tokens"] for _, _, row in rows],
                       sampling=[row["sampling"] for _, _, row in rows], bos_id=tok.bos_id,
                       eos_id=tok.eos_id, rules=rules,
                       on_step=lambda ids: torch.tensor([step(k, int(t)) for k, t in
                                                         enumerate(ids.tolist())]))
    else:
        for k, (_, _, row) in enumerate(rows):
            s = row["sampling"]
            generate(run.model, row["ids"], max_new_tokens=row["max_new_tokens"],
                     bos_id=tok.bos_id, eos_id=tok.eos_id, temperature=s.temperature,
                     top_k=s.top_k, top_p=s.top_p, seed=s.seed, rules=rules,
                     on_token=lambda t, k=k: step(k, t))
    results: dict[int, dict] = {}
    for k, (job, index, row) in enumerate(rows):
        rest = streams[k].finish()
        if rest:
            job.emit("text", (index, rest))
        result = results.setdefault(id(job), {"choices": [], "prompt_tokens": 0})
        result["prompt_tokens"] += len(row["ids"])
        result["choices"].append({"index": index, "text": streams[k].text,
                                  "finish_reason": reason[k] or "length",
                                  "completion_tokens": count[k]})
    for job in jobs:
        job.emit("end", results[id(job)])
    return [results[id(job)] for job in jobs]
