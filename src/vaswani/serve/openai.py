"""OpenAI's response formats: embeddings as floats or base64, the choices and usage of a
completion and of a chat answer, and their server-sent events for streaming: one generic
loop (:func:`sse`) over a server.Generation, each response object's chunks written by an
encoder of its own (:class:`CompletionChunks`, :class:`ChatChunks`)."""

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


def completion_choices(results: list[dict], n: int, *, tokenizer=None, logprobs: bool = False,
                       echo: list[tuple[str, list[int], list]] | None = None
                       ) -> tuple[list, dict]:
    """A completion's choices and usage from server.Generation results (one per prompt,
    ``n`` completions each). ``logprobs``: each choice's, from its chosen tokens; ``echo``:
    per prompt its (text, tokens, log-probability entries), put before the completion (text
    and logprobs)."""
    choices = []
    for p, result in enumerate(results):
        before, before_ids, before_entries = echo[p] if echo else ("", [], [])
        for c in result["choices"]:
            choices.append({"index": p * n + c["index"], "text": before + c["text"],
                            "finish_reason": c["finish_reason"],
                            "logprobs": legacy_logprobs(
                                tokenizer, before_ids + c["ids"], before_entries + c["logprobs"],
                                0 if echo else len(result["prompt"])) if logprobs else None})
    return choices, usage_of(results)


def chat_choices(result: dict, *, tokenizer=None, logprobs: bool = False
                 ) -> tuple[list, dict]:
    """A chat answer's choices and usage from a server.Generation result."""
    choices = [{"index": c["index"], "finish_reason": c["finish_reason"],
                "message": {"role": "assistant", "content": c["text"]},
                "logprobs": chat_logprobs(tokenizer, c["ids"], c["logprobs"])
                if logprobs else None} for c in result["choices"]]
    return choices, usage_of([result])


def usage_of(results: list[dict]) -> dict:
    """OpenAI's ``usage``: the tokens of the prompts and of every completion."""
    prompt = sum(r["prompt_tokens"] for r in results)
    made = sum(c["completion_tokens"] for r in results for c in r["choices"])
    return {"prompt_tokens": prompt, "completion_tokens": made, "total_tokens": prompt + made}


class CompletionChunks:
    """The chunks of a streamed completion (``text_completion``): with ``echo`` (text,
    tokens, entries) the prompt first, then each piece of text with its tokens'
    ``logprobs`` (OpenAI's legacy object, its offsets counted across chunks)."""

    kind, prefix = "text_completion", "cmpl"

    def __init__(self, tokenizer, n: int, prompt: str, *, logprobs: bool = False,
                 echo: tuple[str, list[int], list] | None = None) -> None:
        self.tokenizer, self.logprobs, self.echo = tokenizer, logprobs, echo
        self.offsets = [len(echo[0]) if echo else len(prompt)] * n

    def opening(self, index: int) -> dict | None:
        if self.echo is None:
            return None
        text, ids, entries = self.echo
        lp = legacy_logprobs(self.tokenizer, ids, entries, 0) if self.logprobs else None
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": None}

    def piece(self, index: int, text: str, ids: list[int], entries: list) -> dict:
        lp = None
        if self.logprobs:
            lp = legacy_logprobs(self.tokenizer, ids, entries, self.offsets[index])
            self.offsets[index] += sum(len(p) for p in pieces(self.tokenizer, ids))
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": None}

    def end(self, index: int, reason: str, ids: list[int], entries: list) -> dict:
        """The last chunk: the finish reason, and the tokens no text went out with (an
        ``<eos>``)."""
        return {**self.piece(index, "", ids, entries), "finish_reason": reason}


class ChatChunks:
    """The chunks of a streamed chat answer (``chat.completion.chunk``): the assistant's
    role first, then each piece of its content with its tokens' ``logprobs``."""

    kind, prefix = "chat.completion.chunk", "chatcmpl"

    def __init__(self, tokenizer, *, logprobs: bool = False) -> None:
        self.tokenizer, self.logprobs = tokenizer, logprobs

    def opening(self, index: int) -> dict:
        return {"index": index, "delta": {"role": "assistant", "content": ""},
                "finish_reason": None, "logprobs": None}

    def piece(self, index: int, text: str, ids: list[int], entries: list) -> dict:
        lp = chat_logprobs(self.tokenizer, ids, entries) if self.logprobs else None
        return {"index": index, "delta": {"content": text}, "finish_reason": None,
                "logprobs": lp}

    def end(self, index: int, reason: str, ids: list[int], entries: list) -> dict:
        """The last chunk: the finish reason, and the tokens no text went out with (an
        ``<eos>``)."""
        lp = chat_logprobs(self.tokenizer, ids, entries) if self.logprobs else None
        return {"index": index, "delta": {}, "finish_reason": reason, "logprobs": lp}


def sse(generation, http: HTTPRequest, model: str, chunks: CompletionChunks | ChatChunks, *,
        usage: bool = False) -> StreamingResponse:
    """Server-sent events of a server.Generation, each choice as ``chunks`` writes it: its
    opening, one chunk per piece of text (with the tokens it ends), a last one with its
    finish reason; with ``usage`` a chunk of the tokens counted; then [DONE]. A client that
    goes away cancels the generation."""
    ident = f"{chunks.prefix}-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    sent = [0] * len(generation.completions)  # tokens that went out, per completion

    def data(*choices: dict, **more) -> str:
        return "data: " + json.dumps({"id": ident, "object": chunks.kind, "created": created,
                                      "model": model, "choices": list(choices),
                                      **more}) + "\n\n"

    def tokens(index: int, upto: int | None = None) -> tuple[list[int], list]:
        """Completion ``index``'s chosen tokens (and their log-probability entries) since
        the last chunk, up to ``upto`` (default: all); none without log-probabilities."""
        if not chunks.logprobs:
            return [], []
        r = generation.completions[index].request
        upto = len(r.logprobs) if upto is None else upto
        ids = chosen_ids(r, generation.eos_id)[sent[index]:upto]
        entries = r.logprobs[sent[index]:upto]
        sent[index] = upto
        return ids, entries

    async def events():
        try:
            for i in range(len(generation.completions)):
                opening = chunks.opening(i)
                if opening is not None:
                    yield data(opening)
            while True:
                try:  # what has come already, else wait for it (a second at a time)
                    kind, value = generation.events.get_nowait()
                except asyncio.QueueEmpty:
                    try:
                        async with asyncio.timeout(1.0):
                            kind, value = await generation.events.get()
                    except TimeoutError:
                        if await http.is_disconnected():
                            generation.cancel()
                            return
                        continue
                if kind == "text":
                    index, text, upto = value
                    yield data(chunks.piece(index, text, *tokens(index, upto)))
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
                for index, text in generation.rest():
                    yield data(chunks.piece(index, text, *tokens(index)))
                for index, reason in enumerate(generation.finish_reasons()):
                    yield data(chunks.end(index, reason, *tokens(index)))
                if usage:
                    prompt = len(generation.completions[0].request.prompt)
                    made = sum(c.request.generated for c in generation.completions)
                    yield data(usage={"prompt_tokens": prompt, "completion_tokens": made,
                                      "total_tokens": prompt + made})
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
