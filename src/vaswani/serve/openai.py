"""OpenAI's response formats: embeddings as floats or base64, completion choices with
usage, and server-sent events for streaming."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid

import torch
from fastapi import Request
from fastapi.responses import StreamingResponse

from .workers import Job


def vector(v: torch.Tensor, encoding: str):
    if encoding == "base64":
        return base64.b64encode(v.numpy().astype("<f4").tobytes()).decode()
    return [round(float(x), 7) for x in v.tolist()]


def choices(results: list[dict], n: int, *, chat_mode: bool) -> tuple[list, dict]:
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for p, result in enumerate(results):
        prompt_tokens += result["prompt_tokens"]
        for c in result["choices"]:
            completion_tokens += c["completion_tokens"]
            index = p * n + c["index"]
            if chat_mode:
                choices.append({"index": index, "finish_reason": c["finish_reason"],
                                "message": {"role": "assistant", "content": c["text"]}})
            else:
                choices.append({"index": index, "text": c["text"], "logprobs": None,
                                "finish_reason": c["finish_reason"]})
    return choices, {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                     "total_tokens": prompt_tokens + completion_tokens}


def sse(job: Job, request: Request, model: str, kind: str, *, chat_mode: bool):
    """Server-sent events: one chunk per text piece, a last one with the finish reason, then
    [DONE]. A client that goes away cancels the job's rows."""
    ident = f"{'chatcmpl' if chat_mode else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    created = int(time.time())

    def chunk(index: int, text: str | None, finish: str | None, first: bool = False) -> str:
        if chat_mode:
            delta = {"role": "assistant", "content": ""} if first else (
                {"content": text} if text is not None else {})
            choice = {"index": index, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None,
                      "finish_reason": finish}
        return "data: " + json.dumps({"id": ident, "object": kind, "created": created,
                                      "model": model, "choices": [choice]}) + "\n\n"

    async def events():
        try:
            if chat_mode:
                for i in range(len(job.payload["rows"])):
                    yield chunk(i, None, None, first=True)
            while True:
                try:
                    kind_, value = await asyncio.wait_for(job.events.get(), timeout=1.0)
                except TimeoutError:
                    if await request.is_disconnected():
                        job.cancelled = True
                        return
                    continue
                if kind_ == "text":
                    yield chunk(value[0], value[1], None)
                else:
                    for c in value["choices"]:
                        yield chunk(c["index"], None if chat_mode else "", c["finish_reason"])
                    yield "data: [DONE]\n\n"
                    return
        except asyncio.CancelledError:  # the client went away
            job.cancelled = True
            raise

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
