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


def sse(generation, request: Request, model: str, kind: str, *, chat_mode: bool):
    """Server-sent events of a server.Generation: one chunk per piece of text, a last one
    per completion with its finish reason, then [DONE]. A client that goes away cancels the
    generation."""
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
                for i in range(len(generation.completions)):
                    yield chunk(i, None, None, first=True)
            while True:
                try:  # what has come already, else wait for it (a second at a time)
                    kind_, value = generation.events.get_nowait()
                except asyncio.QueueEmpty:
                    try:
                        async with asyncio.timeout(1.0):
                            kind_, value = await generation.events.get()
                    except TimeoutError:
                        if await request.is_disconnected():
                            generation.cancel()
                            return
                        continue
                if kind_ == "text":
                    yield chunk(value[0], value[1], None)
                    continue
                failed = next((c.request.error for c in generation.completions
                               if c.request.error is not None), None)
                if failed is not None:  # as OpenAI streams an error: one data chunk
                    yield "data: " + json.dumps({"error": {
                        "message": str(failed), "type": "invalid_request_error"
                        if isinstance(failed, ValueError) else "server_error",
                        "param": None, "code": None}}) + "\n\n"
                    yield "data: [DONE]\n\n"
                    return
                for index, piece in generation.rest():
                    yield chunk(index, piece, None)
                for index, reason in enumerate(generation.finish_reasons()):
                    yield chunk(index, None if chat_mode else "", reason)
                yield "data: [DONE]\n\n"
                return
        except asyncio.CancelledError:  # the client went away
            generation.cancel()
            raise

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
