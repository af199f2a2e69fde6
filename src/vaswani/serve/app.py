"""The HTTP API and the page: ``create_app(runs)`` -> a FastAPI application.

Routes (JSON in and out; errors as ``{"error": {"message", "type", "param"}}`` with a 4xx or
5xx status):

    GET  /health, /metrics (Prometheus), /v1/models
    POST /v1/completions, /v1/chat/completions    decoder runs (OpenAI's; streaming as SSE)
    POST /v1/embeddings                           encoder runs (OpenAI's; float or base64)
    POST /v1/classify                             encoder runs with a classification head
    POST /v1/translate                            encoder-decoder runs (beam, n-best)
    POST /v1/attention                            any run: every layer's and head's weights
    GET  /                                        the page (self-contained, works offline)

A translator's or a language model's work runs on its inference engine, in a thread of its
own (server.py, serve/loop.py): requests join the running batch at the next step and leave
it when they end. An encoder's work is batched (batcher.py), in that same thread. openai.py
shapes OpenAI's responses. With an API key, every /v1 route needs ``Authorization: Bearer
KEY``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from importlib import resources

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from ..inference import Run
from . import chat, openai, schemas
from .batcher import Busy
from .server import Generation, Limits, Refused, Server, UnknownModel

# --- the application ------------------------------------------------------------------------


class ApiError(Exception):
    """An answer other than 2xx: its HTTP status, message, type and the field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None):
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")


def create_app(runs: dict[str, Run], *, api_key: str | None = None, max_batch: int = 64,
               max_wait_ms: float = 5.0, max_queue: int = 256,
               fast_lane: int | None = None, limits: Limits | None = None,
               allowed_hosts: tuple[str, ...] | list[str] = LOOPBACK,
               threads: int | None = None) -> FastAPI:
    """``allowed_hosts``: the names a request's Host header may carry (the loopback ones by
    default; ``("*",)`` for any): a web page cannot reach a local server through DNS
    rebinding, whose requests carry the page's own host name. ``threads``: PyTorch's
    threads in the thread that runs the models (default: as many as this thread has).
    ``fast_lane``: the engines' (engine/engine.py ``EngineConfig``; None: their default)."""
    limits = limits or Limits()
    server = Server(runs, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue,
                    fast_lane=fast_lane, limits=limits, threads=threads)
    app = FastAPI(title="vaswani", description=__doc__.split("\n\n")[0])
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
    app.state.server = server
    app.router.on_shutdown.append(server.close)

    # The API-key check and the small JSON routes are coroutines: FastAPI runs a plain
    # function in a worker thread, and every request would hop there and back (under load,
    # each hop waits for a core that the models' threads are using).
    async def authorised(request: Request) -> None:
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            raise ApiError(401, "a valid API key is needed: Authorization: Bearer KEY",
                           kind="authentication_error")

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return JSONResponse(error_body(e.message, e.kind, e.param), status_code=e.status)

    @app.exception_handler(Refused)  # the server's refusals (server.py), as HTTP answers
    async def refused(request, e: Refused):
        if isinstance(e, UnknownModel):
            return JSONResponse(error_body(e.message, "not_found_error", e.param), 404)
        return JSONResponse(error_body(e.message, param=e.param), status_code=400)

    @app.exception_handler(Busy)
    async def busy(request, e: Busy):
        return JSONResponse(error_body(str(e), "server_busy"), status_code=503)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, e: RequestValidationError):
        errors = e.errors() or [{"loc": (), "msg": "invalid request"}]
        # a field that may be a text or a list of texts fails once per form: the error that
        # says what is wrong with the value (a lone surrogate) beats "should be a list"
        first = next((x for x in errors if x.get("type") == "value_error"), errors[0])
        path = [x for x in first["loc"] if x != "body" and not _form(x)]
        where = ".".join(str(x) for x in path)
        what = first["msg"].removeprefix("Value error, ")
        message = f"{where}: {what}" if where else what
        param = str(path[0]) if path else None
        if first.get("type") == "json_invalid":
            message, param = f"the body is not valid JSON ({first['msg']})", None
        return JSONResponse(error_body(message, param=param), status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        return JSONResponse(error_body(str(e.detail), "not_found_error" if e.status_code == 404
                                       else "invalid_request_error"), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def crashed(request, e: Exception):
        return JSONResponse(error_body(f"internal error: {type(e).__name__}: {e}",
                                       "server_error"), status_code=500)

    guard = [Depends(authorised)]

    @app.get("/health")
    async def health():
        return {"status": "ok", "models": list(runs), "auth": bool(api_key),
                "served": {name: server.served(name) for name in runs}}

    @app.get("/metrics")
    async def metrics():
        body, media_type = server.metrics.exposition()
        return Response(body, media_type=media_type)

    @app.get("/v1/models", dependencies=guard)
    async def models():
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": server.started, "owned_by": "vaswani",
             "task": run.task.name, "arch": run.config.model.arch, "action": run.action,
             "summary": run.summary, "target": run.takes_target,
             "chat": run.chat_template is not None, "labels": run.labels}
            for name, run in runs.items()]}

    @app.post("/v1/translate", dependencies=guard)
    async def translate(body: schemas.TranslateRequest):
        run = server.run_for(body.model, "translate")
        texts = _texts(body.input, limits)
        decode = _decode(run, beam=body.beam, n_best=body.n_best,
                         length_penalty=body.length_penalty,
                         no_repeat_ngram_size=body.no_repeat_ngram_size,
                         repetition_penalty=body.repetition_penalty,
                         min_length=body.min_length)
        results = await server.translate(body.model, texts, decode)
        return {"object": "list", "model": body.model, "data": [
            {"index": i, "translations": [{"text": t, "score": s} for t, s in hyps]}
            for i, hyps in enumerate(results)]}

    @app.post("/v1/classify", dependencies=guard)
    async def classify(body: schemas.ClassifyRequest):
        run = server.run_for(body.model, "classify")
        if not run.labels:
            raise ApiError(400, f"model {body.model!r} has no classification head (an "
                           "imported encoder): use /v1/embeddings", "model")
        results = await server.encode(body.model, "classify", _texts(body.input, limits))
        return {"object": "list", "model": body.model, "data": [
            {"index": i, "label": max(p, key=p.get), "probability": max(p.values()),
             "probabilities": p} for i, p in enumerate(results)]}

    @app.post("/v1/embeddings", dependencies=guard)
    async def embeddings(body: schemas.EmbeddingRequest):
        run = server.run_for(body.model, "embeddings")
        texts = _texts(body.input, limits)
        vectors = await server.encode(body.model, "embed", texts)
        n_tokens = sum(len(run.source_tokenizer.encode(t)) for t in texts)
        return {"object": "list", "model": body.model, "data": [
            {"object": "embedding", "index": i, "embedding": openai.vector(v, body.encoding_format)}
            for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}

    @app.post("/v1/completions", dependencies=guard)
    async def completions(body: schemas.CompletionRequest, request: Request):
        run = server.run_for(body.model, "completions")
        prompts = _texts(body.prompt, limits, allow_empty=True)
        if body.stream and len(prompts) > 1:
            raise ApiError(400, "stream with a list of prompts is not supported; send one "
                           "prompt per request", "prompt")
        generations = [_generation(server, run, body, body.model, p, body.max_tokens)
                       for p in prompts]
        if body.stream:
            return openai.sse(generations[0], request, body.model, "text_completion",
                              chat_mode=False)
        results = [await _result(g) for g in generations]
        choices, usage = openai.choices(results, body.n, chat_mode=False)
        return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion",
                "created": int(time.time()), "model": body.model, "choices": choices,
                "usage": usage}

    @app.post("/v1/chat/completions", dependencies=guard)
    async def chat_completions(body: schemas.ChatRequest, request: Request):
        run = server.run_for(body.model, "chat")
        if run.chat_template is None:
            raise ApiError(400, f"model {body.model!r} has no chat template (a model trained "
                           "with vaswani has none); use /v1/completions with a plain prompt",
                           "model")
        tok = run.source_tokenizer
        try:
            prompt = chat.render(run.chat_template, [m.model_dump() for m in body.messages],
                                 bos_token=tok.token(tok.bos_id), eos_token=tok.token(tok.eos_id))
        except chat.TemplateError as e:
            raise ApiError(400, str(e), "messages") from None
        _check_length(prompt, limits, "messages")
        generation = _generation(server, run, body, body.model, prompt,
                                 body.max_completion_tokens or body.max_tokens)
        if body.stream:
            return openai.sse(generation, request, body.model, "chat.completion.chunk",
                              chat_mode=True)
        choices, usage = openai.choices([await _result(generation)], body.n, chat_mode=True)
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
                "created": int(time.time()), "model": body.model, "choices": choices,
                "usage": usage}

    @app.post("/v1/attention", dependencies=guard)
    async def attention(body: schemas.AttentionRequest):
        run = server.run_for(body.model, "attention")
        for name, text in (("input", body.input), ("target", body.target)):
            if text is None:
                continue
            _check_length(text, limits, name)
            n = len(run.source_tokenizer.encode(text))
            if n > limits.max_attention_tokens:
                raise ApiError(400, f"{name} is {n} tokens; /v1/attention takes at most "
                               f"{limits.max_attention_tokens}", name)
        if not body.input.strip():
            raise ApiError(400, "input is empty", "input")
        target = body.target
        if target is None and run.takes_target:  # a translator explains its own greedy
            # translation: made by the server's engine, as /v1/translate's (a second engine
            # for it, the run's offline one, would hold its own cache for the server's life)
            greedy = run.decode_options(beam=1, n_best=1)
            target = (await server.translate(body.model, [body.input], greedy))[0][0][0]
        view = await server.call(body.model, lambda: run.attention_view(body.input, target))
        return {"model": body.model, **view}

    @app.get("/", response_class=HTMLResponse)
    def page():
        return _page_file("index.html")

    @app.get("/app.js")
    def script():
        return Response(_page_file("app.js"), media_type="text/javascript")

    @app.get("/style.css")
    def style():
        return Response(_page_file("style.css"), media_type="text/css")

    return app


def _page_file(name: str) -> str:
    return resources.files("vaswani.serve").joinpath("page", name).read_text(encoding="utf-8")


# --- request helpers -----------------------------------------------------------------------

def _check_length(text: str, limits: Limits, param: str) -> None:
    if len(text) > limits.max_input_chars:
        raise ApiError(400, f"{param} is {len(text):,} characters; the limit is "
                       f"{limits.max_input_chars:,}", param)


def _texts(value: str | list[str], limits: Limits, *, allow_empty: bool = False) -> list[str]:
    texts = [value] if isinstance(value, str) else list(value)
    if not texts:
        raise ApiError(400, "input is an empty list", "input")
    if len(texts) > limits.max_items:
        raise ApiError(400, f"input has {len(texts)} items; the limit is {limits.max_items}",
                       "input")
    for text in texts:
        _check_length(text, limits, "input")
        if not allow_empty and not text.strip():
            raise ApiError(400, "input holds an empty text", "input")
    return texts


def _decode(run: Run, **given):
    try:
        return run.decode_options(**given)
    except ValueError as e:
        raise ApiError(400, str(e)) from None


def _generation(server: Server, run: Run, body, name: str, prompt: str,
                max_tokens: int | None) -> Generation:
    limits = server.limits
    if body.n > limits.max_n:
        raise ApiError(400, f"n ({body.n}) is over the limit of {limits.max_n}", "n")
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise ApiError(400, f"max_tokens ({max_tokens}) is over the limit of "
                       f"{limits.max_tokens}", "max_tokens")
    ids = run.source_tokenizer.encode(prompt)  # counted here, and not made again
    n = len(ids)
    if n > limits.max_prompt_tokens:
        raise ApiError(400, f"the prompt is {n:,} tokens; the limit is "
                       f"{limits.max_prompt_tokens:,}", "prompt")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    decode = _decode(run, max_new_tokens=max_tokens, temperature=body.temperature,
                     top_p=body.top_p, top_k=body.top_k, stop=stop,
                     presence_penalty=body.presence_penalty,
                     frequency_penalty=body.frequency_penalty,
                     repetition_penalty=body.repetition_penalty,
                     no_repeat_ngram_size=body.no_repeat_ngram_size, min_length=body.min_tokens)
    return server.generate(name, prompt, decode, n=body.n, seed=body.seed, stream=body.stream,
                           ids=ids)


async def _result(generation: Generation) -> dict:
    try:
        await generation.done
    except asyncio.CancelledError:  # the client went away
        generation.cancel()
        raise
    return generation.result()


def _form(part) -> bool:
    """A part of pydantic's error location that names a type, not a field: "str",
    "list[str]", "function-after[encodable(), str]"."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool"))


class BodyLimit:
    """Refuse a request body over ``limit`` bytes with 413 before it is read whole: at once
    by its Content-Length, or as soon as more arrives when it streams in chunks. A body within
    the limit is read here and handed on as one message."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            return await self.refuse(send)
        chunks, size, last = [], 0, None
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                last = message
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self.refuse(send)
            if not message.get("more_body"):
                break
        pending = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
        if last is not None:
            pending.append(last)

        async def replay():
            return pending.pop(0) if pending else await receive()

        await self.app(scope, replay, send)

    async def refuse(self, send) -> None:
        body = json.dumps(error_body(f"the request body is over the limit of {self.limit:,} "
                                     "bytes")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
