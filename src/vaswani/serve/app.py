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

The routes are routes.py's; here the application around them: the limits on a body and on
the Host header, the API key, and the errors (each refusal of the server, server.py, answered
with its status). A translator's or a language model's work runs on its inference engine, in
a thread of its own (server.py, loop.py): requests join the running batch at the next step
and leave it when they end. An encoder's work is batched (batcher.py), in that same thread.
openai.py shapes OpenAI's responses. With an API key, every /v1 route needs
``Authorization: Bearer KEY``.
"""

from __future__ import annotations

import json

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from ..inference import Run
from . import routes, schemas
from .batcher import Busy
from .bodies import ApiError
from .routes import error_body
from .server import ClientGone, Limits, Refused, Server, UnknownModel

# --- the application ------------------------------------------------------------------------


LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")


def create_app(runs: dict[str, Run], *, api_key: str | None = None, max_batch: int = 64,
               max_wait_ms: float = 5.0, max_queue: int = 256,
               fast_lane: int | None = None, limits: Limits | None = None,
               allowed_hosts: tuple[str, ...] | list[str] = LOOPBACK,
               threads: int | None = None, prefix_cache_mb: int | None = None) -> FastAPI:
    """``allowed_hosts``: the names a request's Host header may carry (the loopback ones by
    default; ``("*",)`` for any): a web page cannot reach a local server through DNS
    rebinding, whose requests carry the page's own host name. ``threads``: PyTorch's
    threads in the thread that runs the models (default: as many as this thread has).
    ``fast_lane``, ``prefix_cache_mb`` (the memory kept prompt prefixes may hold; 0: none
    kept): the engines' (engine/config.py ``EngineConfig``; None: their default)."""
    limits = limits or Limits()
    server = Server(runs, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue,
                    fast_lane=fast_lane, limits=limits, threads=threads,
                    prefix_cache_mb=prefix_cache_mb)
    app = FastAPI(title="vaswani", description=__doc__.split("\n\n")[0])
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
    app.state.server, app.state.api_key = server, api_key
    app.router.on_shutdown.append(server.close)

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return JSONResponse(error_body(e.message, e.kind, e.param), status_code=e.status)

    @app.exception_handler(Refused)  # the server's refusals (server.py), as HTTP answers
    async def refused(request, e: Refused):
        if isinstance(e, UnknownModel):
            return JSONResponse(error_body(e.message, "not_found_error", e.param), 404)
        return JSONResponse(error_body(e.message, param=e.param), status_code=400)

    @app.exception_handler(ClientGone)
    async def gone(request, e: ClientGone):  # nobody reads it: nginx's "client closed request"
        return JSONResponse(error_body(str(e)), status_code=499)

    @app.exception_handler(Busy)
    async def busy(request, e: Busy):
        return JSONResponse(error_body(str(e), "server_busy"), status_code=503)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, e: RequestValidationError):
        errors = e.errors() or [{"loc": (), "msg": "invalid request"}]
        kind = request.headers.get("content-type", "")
        if request.method == "POST" and "json" not in kind.lower():  # not read as JSON at all
            came = f"with Content-Type {kind!r}" if kind else "with no Content-Type"
            return JSONResponse(error_body("the body must be JSON, sent with Content-Type: "
                                           f"application/json (it came {came})"),
                                status_code=415)
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

    app.include_router(routes.info)
    app.include_router(routes.api)
    app.include_router(routes.pages)
    app.openapi = lambda: _schema_with(app, limits)
    return app


def _schema_with(app: FastAPI, limits: Limits) -> dict:
    """The OpenAPI schema, with this server's limits as the fields' bounds (the request
    models' own bounds are the widest any server takes): a client generated from it, or
    schemathesis, asks for nothing this server refuses by its limits."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version,
                             description=app.description, routes=app.routes)
        bounds = {"n": limits.max_n, "max_tokens": limits.max_tokens,
                  "max_completion_tokens": limits.max_tokens}
        for title, model in schema.get("components", {}).get("schemas", {}).items():
            if title.endswith("Request") and "model" in model.get("properties", {}):
                model["additionalProperties"] = False  # others are refused by name (400)
                if title in ("CompletionRequest", "ChatRequest", "EmbeddingRequest"):
                    model["properties"].update({name: {"description": f"accepted, changes "
                                                       f"nothing: {why}"}
                                                for name, why in schemas.NO_OPS.items()})
            for name, field in model.get("properties", {}).items():
                for option in field.get("anyOf", [field]):
                    if name in bounds and "maximum" in option:
                        option["maximum"] = min(option["maximum"], bounds[name])
                    if option.get("type") == "string" and name in ("input", "prompt"):
                        option["maxLength"] = limits.max_input_chars
                    if option.get("type") == "array" and name in ("input", "prompt"):
                        option["maxItems"] = limits.max_items
        app.openapi_schema = schema
    return app.openapi_schema


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
