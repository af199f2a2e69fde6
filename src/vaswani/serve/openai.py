"""OpenAI's response formats: embeddings as floats or base64, completion choices with
usage, and server-sent events for streaming."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid

import torch
from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse

from .server import chosen_ids


def vector(v: torch.Tensor, encoding: str):
    if encoding == "base64":
        return base64.b64encode(v.numpy().astype("<f4").tobytes()).decode()
    return [round(float(x), 7) for x in v.tolist()]


def pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each token's part of the decoded text of ``ids``: together they are the text (a token
    that ends inside a character has the empty part, the next one the whole character).
    Decoded a few tokens at a time, as language_model.py's TextStream does."""
    decode, out = tokenizer.decode, []
    start = read = 0
    for i in range(len(ids)):
        new = decode(ids[start:i + 1])[len(decode(ids[start:read])):]
        if new.endswith("\ufffd") and i + 1 < len(ids):
            out.append("")
            continue
        out.append(new)
        start, read = read, i + 1
    return out


def label(tokenizer, i: int, piece: str) -> str:
    """A token as OpenAI's ``tokens`` name it: its text, or (a special or partial token) its
    name in the vocabulary."""
    return piece or tokenizer.token(i)


def legacy_logprobs(tokenizer, ids: list[int], entries: list, offset: int) -> dict:
    """OpenAI's completions ``logprobs`` object for tokens ``ids`` whose ``entries`` are
    (log-probability or None, [(token, log-probability), ...] or None), the first token's
    text at ``offset`` in the answer's text."""
    parts = pieces(tokenizer, ids)
    tokens, token_logprobs, top, text_offset = [], [], [], []
    for i, piece, (lp, alternatives) in zip(ids, parts, entries, strict=True):
        tokens.append(label(tokenizer, i, piece))
        token_logprobs.append(lp)
        top.append(None if alternatives is None else
                   {label(tokenizer, a, tokenizer.decode([a])): v for a, v in alternatives})
        text_offset.append(offset)
        offset += len(piece)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
            "text_offset": text_offset}


def chat_logprobs(tokenizer, ids: list[int], entries: list) -> dict:
    """OpenAI's chat ``logprobs`` object: per token its text, log-probability and bytes, and
    the alternatives'."""
    def one(i: int, text: str, lp: float) -> dict:
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    content = []
    for i, piece, (lp, alternatives) in zip(ids, pieces(tokenizer, ids), entries, strict=True):
        content.append({**one(i, label(tokenizer, i, piece), lp), "top_logprobs": [
            one(a, label(tokenizer, a, tokenizer.decode([a])), v) for a, v in alternatives]})
    return {"content": content, "refusal": None}


def choices(results: list[dict], n: int, *, chat_mode: bool, tokenizer=None,
            logprobs: bool = False, echo: list[tuple[str, list[int], list]] | None = None
            ) -> tuple[list, dict]:
    """The choices and usage of a completion or chat answer from server.Generation results
    (one per prompt, ``n`` completions each). ``logprobs``: each choice's, from its chosen
    tokens; ``echo``: per prompt its (text, tokens, log-probability entries), put before the
    completion (text and logprobs)."""
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for p, result in enumerate(results):
        prompt_tokens += result["prompt_tokens"]
        before, before_ids, before_entries = echo[p] if echo else ("", [], [])
        for c in result["choices"]:
            completion_tokens += c["completion_tokens"]
            index = p * n + c["index"]
            entries = [(lp, alternatives) for lp, alternatives in c["logprobs"]]
            if chat_mode:
                choice = {"index": index, "finish_reason": c["finish_reason"],
                          "message": {"role": "assistant", "content": c["text"]},
                          "logprobs": chat_logprobs(tokenizer, c["ids"], entries)
                          if logprobs else None}
            else:
                text = before + c["text"]
                choice = {"index": index, "text": text, "finish_reason": c["finish_reason"],
                          "logprobs": legacy_logprobs(tokenizer, before_ids + c["ids"],
                                                      before_entries + entries,
                                                      0 if echo else len(result["prompt"]))
                          if logprobs else None}
            choices.append(choice)
    return choices, {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                     "total_tokens": prompt_tokens + completion_tokens}


def sse(generation, http: HTTPRequest, model: str, kind: str, *, chat_mode: bool,
        tokenizer=None, logprobs: bool = False, echo: tuple[str, list[int], list] | None = None,
        usage: bool = False):
    """Server-sent events of a server.Generation: one chunk per piece of text (with
    ``logprobs``, the log-probabilities of the tokens it ends), a last one per completion with
    its finish reason, with ``usage`` a chunk of the tokens counted, then [DONE]. ``echo``:
    the prompt (text, tokens, entries) first, as a completion's. A client that goes away
    cancels the generation."""
    ident = f"{'chatcmpl' if chat_mode else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    sent = [0] * len(generation.completions)  # tokens whose log-probabilities went out
    offsets = [len(echo[0]) if echo else len(generation.prompt)] * len(generation.completions)

    def data(body: dict) -> str:
        return "data: " + json.dumps({"id": ident, "object": kind, "created": created,
                                      "model": model, **body}) + "\n\n"

    def token_logprobs(index: int, upto: int | None) -> dict | None:
        """The log-probabilities of completion ``index``'s tokens since the last chunk."""
        if not logprobs:
            return None
        r = generation.completions[index].request
        upto = len(r.logprobs) if upto is None else upto
        entries = r.logprobs[sent[index]:upto]
        ids = chosen_ids(r, generation.eos_id)[sent[index]:upto]
        sent[index] = upto
        if chat_mode:
            return chat_logprobs(tokenizer, ids, entries)
        out = legacy_logprobs(tokenizer, ids, entries, offsets[index])
        offsets[index] += sum(len(p) for p in pieces(tokenizer, ids))
        return out

    def chunk(index: int, text: str | None, finish: str | None, first: bool = False,
              upto: int | None = None, with_logprobs: bool = True) -> str:
        lp = token_logprobs(index, upto) if with_logprobs and not first else None
        if chat_mode:
            delta = {"role": "assistant", "content": ""} if first else (
                {"content": text} if text is not None else {})
            choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": lp}
        else:
            choice = {"index": index, "text": text or "", "logprobs": lp,
                      "finish_reason": finish}
        return data({"choices": [choice]})

    async def events():
        try:
            for i in range(len(generation.completions)):
                if chat_mode:
                    yield chunk(i, None, None, first=True)
                elif echo:  # the prompt first, with its tokens' log-probabilities
                    lp = legacy_logprobs(tokenizer, echo[1], echo[2], 0) if logprobs else None
                    yield data({"choices": [{"index": i, "text": echo[0], "logprobs": lp,
                                             "finish_reason": None}]})
            while True:
                try:  # what has come already, else wait for it (a second at a time)
                    kind_, value = generation.events.get_nowait()
                except asyncio.QueueEmpty:
                    try:
                        async with asyncio.timeout(1.0):
                            kind_, value = await generation.events.get()
                    except TimeoutError:
                        if await http.is_disconnected():
                            generation.cancel()
                            return
                        continue
                if kind_ == "text":
                    index, piece, upto = value
                    yield chunk(index, piece, None, upto=upto)
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
                    yield chunk(index, None if chat_mode else "", reason)  # the rest's tokens
                if usage:
                    prompt = len(generation.completions[0].request.prompt)
                    made = sum(c.request.generated for c in generation.completions)
                    yield data({"choices": [], "usage": {
                        "prompt_tokens": prompt, "completion_tokens": made,
                        "total_tokens": prompt + made}})
                yield "data: [DONE]\n\n"
                return
        except asyncio.CancelledError:  # the client went away
            generation.cancel()
            raise

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def sse_of(answer: dict, *, usage: bool = False) -> StreamingResponse:
    """A finished chat answer as the server-sent events of a stream (an answer with tool
    calls goes out whole: the calls in one chunk each, as OpenAI's deltas add up to them)."""
    def data(body: dict) -> str:
        return "data: " + json.dumps({"id": answer["id"], "object": "chat.completion.chunk",
                                      "created": answer["created"], "model": answer["model"],
                                      **body}) + "\n\n"

    def events():
        for choice in answer["choices"]:
            i, message = choice["index"], choice["message"]
            yield data({"choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None, "logprobs": None}]})
            if message.get("content"):
                yield data({"choices": [{"index": i, "delta": {"content": message["content"]},
                                         "finish_reason": None,
                                         "logprobs": choice.get("logprobs")}]})
            for k, call in enumerate(message.get("tool_calls") or []):
                yield data({"choices": [{"index": i, "delta": {"tool_calls": [
                    {"index": k, **call}]}, "finish_reason": None, "logprobs": None}]})
            yield data({"choices": [{"index": i, "delta": {},
                                     "finish_reason": choice["finish_reason"],
                                     "logprobs": None}]})
        if usage:
            yield data({"choices": [], "usage": answer["usage"]})
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
