"""The routes of ``vaswani serve`` (app.py builds the application around them): the model
routes under /v1 (behind the API key when there is one), /health and /metrics, and the page.

Each route checks what the request asks against the server's limits (a 400 that names the
field and the limit), hands the work to the server (server.py) and shapes the answer
(OpenAI's where there is one: openai.py). Every route and dependency here is a coroutine:
FastAPI runs a plain function in a worker thread, and every request would hop there and back
(under load, each hop waits for a core that the models' threads are using); only the page's
static files, which touch no model, are plain functions.
"""

from __future__ import annotations

import time
import uuid
from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi import Request as HTTPRequest
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from ..inference import Run
from . import bodies, chat, openai, schemas, tools
from .bodies import ApiError
from .server import Generation, Server, until


async def the_server(http: HTTPRequest) -> Server:
    return http.app.state.server


async def authorised(http: HTTPRequest) -> None:
    key = http.app.state.api_key
    if key and http.headers.get("authorization") != f"Bearer {key}":
        raise ApiError(401, "a valid API key is needed: Authorization: Bearer KEY",
                       kind="authentication_error")


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None):
    """An error answer's body, as OpenAI's."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


TheServer = Annotated[Server, Depends(the_server)]
info = APIRouter()  # /health, /metrics
# what a /v1 route may answer besides 200, as the OpenAPI schema says (schemas.ErrorBody)
ERRORS = {status: {"model": schemas.ErrorBody, "description": why} for status, why in (
    (400, "a field the server refuses or does not implement, or a limit passed (named)"),
    (401, "an API key is needed"), (404, "no model of that name"),
    (413, "the body is over the limit"), (415, "the body is not JSON"),
    (422, "a field of the wrong type or out of its range"),
    (499, "the client closed its connection before the answer"),
    (503, "the model's queue is full; try again shortly"))}
api = APIRouter(prefix="/v1", dependencies=[Depends(authorised)], responses=ERRORS)
pages = APIRouter(include_in_schema=False)  # the page and its files: not the API


@info.get("/health")
async def health(http: HTTPRequest, server: TheServer):
    return {"status": "ok", "models": list(server.runs),
            "auth": bool(http.app.state.api_key),
            "served": {name: server.served(name) for name in server.runs}}


@info.get("/metrics", response_class=PlainTextResponse,
          responses={200: {"content": {"text/plain": {}},
                           "description": "Prometheus' text format"}})
async def metrics(server: TheServer):
    body, media_type = server.metrics.exposition()
    return Response(body, media_type=media_type)


@api.get("/models")
async def models(server: TheServer):
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": server.started, "owned_by": "vaswani",
         "task": run.task.name, "arch": run.config.model.arch, "action": run.action,
         "summary": run.summary, "target": run.takes_target,
         "chat": run.chat_template is not None, "labels": run.labels}
        for name, run in server.runs.items()]}


@api.post("/translate")
async def translate(body: schemas.TranslateRequest, http: HTTPRequest, server: TheServer):
    bodies.implemented(body)
    run = server.run_for(body.model, "translate")
    texts = bodies.texts(body.input, server.limits)
    bodies.fits(run, body.model, texts, body.input)
    decode = bodies.decode(run, beam=body.beam, n_best=body.n_best,
                     length_penalty=body.length_penalty,
                     no_repeat_ngram_size=body.no_repeat_ngram_size,
                     repetition_penalty=body.repetition_penalty,
                     min_length=body.min_length)
    results = await server.translate(body.model, texts, decode, http.is_disconnected)
    return {"object": "list", "model": body.model, "data": [
        {"index": i, "translations": [{"text": t, "score": s} for t, s in hyps]}
        for i, hyps in enumerate(results)]}


@api.post("/classify")
async def classify(body: schemas.ClassifyRequest, http: HTTPRequest, server: TheServer):
    bodies.implemented(body)
    run = server.run_for(body.model, "classify")
    if not run.labels:
        raise ApiError(400, f"model {body.model!r} has no classification head (an "
                       "imported encoder): use /v1/embeddings", "model")
    texts = bodies.texts(body.input, server.limits)
    bodies.fits(run, body.model, texts, body.input)
    results = await server.encode(body.model, "classify", texts, http.is_disconnected)
    return {"object": "list", "model": body.model, "data": [
        {"index": i, "label": max(p, key=p.get), "probability": max(p.values()),
         "probabilities": p} for i, p in enumerate(results)]}


@api.post("/embeddings")
async def embeddings(body: schemas.EmbeddingRequest, http: HTTPRequest, server: TheServer):
    bodies.implemented(body)
    run = server.run_for(body.model, "embeddings")
    texts = bodies.texts(body.input, server.limits)
    bodies.fits(run, body.model, texts, body.input)
    vectors = await server.encode(body.model, "embed", texts, http.is_disconnected)
    n_tokens = sum(len(run.source_tokenizer.encode(t)) for t in texts)
    return {"object": "list", "model": body.model, "data": [
        {"object": "embedding", "index": i, "embedding": openai.vector(v, body.encoding_format)}
        for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


@api.post("/completions")
async def completions(body: schemas.CompletionRequest, http: HTTPRequest, server: TheServer):
    bodies.implemented(body)
    run = server.run_for(body.model, "completions")
    prompts = bodies.prompts(server, run, body.prompt)
    if body.stream and len(prompts) > 1:
        raise ApiError(400, "stream with a list of prompts is not supported; send one "
                       "prompt per request", "prompt")
    if body.max_tokens == 0 and not body.echo:
        raise ApiError(400, "max_tokens (0) generates nothing; with echo it scores the prompt",
                       "max_tokens")
    tok, keep = run.source_tokenizer, body.logprobs is not None
    echo = None
    if body.echo:  # the prompt's own log-probabilities, as a scoring pass
        echo = [(text, ids, await _scored(server, body.model, run, ids, body.logprobs))
                for text, ids in prompts]
    if body.max_tokens == 0:  # scoring only: nothing is generated
        if body.n > server.limits.max_n:
            raise ApiError(400, f"n ({body.n}) is over the limit of {server.limits.max_n}", "n")
        results = [{"prompt_tokens": len(ids), "prompt": text, "choices": [
            {"index": k, "text": "", "completion_tokens": 0, "finish_reason": "length",
             "ids": [], "logprobs": []} for k in range(body.n)]} for text, ids in prompts]
        choices, usage = openai.completion_choices(results, body.n, tokenizer=tok,
                                                   logprobs=keep, echo=echo)
        return _completion_answer(body.model, choices, usage)
    decode = bodies.decoding(server, run, body, body.max_tokens, len(prompts))
    constrain = await bodies.constraint(run, body)
    generations = server.generate(body.model, prompts, decode, n=body.n, seed=body.seed,
                                  stream=body.stream, logprobs=body.logprobs,
                                  constrain=constrain)
    if body.stream:
        chunks = openai.CompletionChunks(tok, body.n, generations[0].prompt, logprobs=keep,
                                         echo=echo[0] if echo else None)
        return openai.sse(generations[0], http, body.model, chunks, usage=bodies.usage(body))
    results = [await _result(g, http) for g in generations]
    choices, usage = openai.completion_choices(results, body.n, tokenizer=tok, logprobs=keep,
                                               echo=echo)
    return _completion_answer(body.model, choices, usage)


def _completion_answer(model: str, choices: list, usage: dict) -> dict:
    return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion",
            "created": int(time.time()), "model": model, "choices": choices, "usage": usage}


@api.post("/chat/completions")
async def chat_completions(body: schemas.ChatRequest, http: HTTPRequest, server: TheServer):
    bodies.implemented(body)
    run = server.run_for(body.model, "chat")
    if run.chat_template is None:
        raise ApiError(400, f"model {body.model!r} has no chat template (a model trained "
                       "with vaswani has none); use /v1/completions with a plain prompt",
                       "model")
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    tok = run.source_tokenizer
    choice = tools.choice_of(body)  # None: text only
    functions = [t.function.model_dump(exclude_none=True) for t in body.tools or []]
    if choice is not None:
        bodies.check_tools(run, body.model, choice, functions)
    try:
        prompt = chat.render(run.chat_template, tools.turns(body.messages),
                             bos_token=tok.token(tok.bos_id), eos_token=tok.token(tok.eos_id),
                             tools=[t.model_dump(exclude_none=True) for t in body.tools or []])
    except chat.TemplateError as e:
        raise ApiError(400, str(e), "messages") from None
    bodies.check_length(prompt, server.limits, "messages")
    decode = bodies.decoding(server, run, body, body.max_completion_tokens or body.max_tokens,
                             1)
    top = (body.top_logprobs or 0) if body.logprobs else None
    ids = bodies.prompt_ids(server, run, prompt)
    constrain = await bodies.constraint(run, body, choice, functions)
    streamed = body.stream and choice is None  # calls go out whole, when they are complete
    [generation] = server.generate(body.model, [(prompt, ids)], decode, n=body.n,
                                   seed=body.seed, stream=streamed, logprobs=top,
                                   constrain=constrain)
    if streamed:
        chunks = openai.ChatChunks(tok, logprobs=body.logprobs)
        return openai.sse(generation, http, body.model, chunks, usage=bodies.usage(body))
    result = await _result(generation, http)
    choices, usage = openai.chat_choices(result, tokenizer=tok, logprobs=body.logprobs)
    if choice is not None:  # the calls read out of each answer's text
        for answer, made in zip(choices, result["choices"], strict=True):
            content, calls = tools.split(tools.marked_text(tok, made["ids"]))
            if calls:
                answer["message"].update(content=content, tool_calls=calls)
                answer["finish_reason"] = "tool_calls"
    answer = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
              "created": int(time.time()), "model": body.model, "choices": choices,
              "usage": usage}
    if body.stream:  # (with tools) the whole answer as the chunks of a stream
        return openai.sse_of(answer, usage=bodies.usage(body))
    return answer


@api.post("/attention")
async def attention(body: schemas.AttentionRequest, server: TheServer):
    bodies.implemented(body)
    run = server.run_for(body.model, "attention")
    for name, text in (("input", body.input), ("target", body.target)):
        if text is None:
            continue
        bodies.check_length(text, server.limits, name)
        n = len(run.source_tokenizer.encode(text))
        if n > server.limits.max_attention_tokens:
            raise ApiError(400, f"{name} is {n} tokens; /v1/attention takes at most "
                           f"{server.limits.max_attention_tokens}", name)
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


@pages.get("/", response_class=HTMLResponse)
def page():
    return _page_file("index.html")


@pages.get("/app.js")
def script():
    return Response(_page_file("app.js"), media_type="text/javascript")


@pages.get("/style.css")
def style():
    return Response(_page_file("style.css"), media_type="text/css")


def _page_file(name: str) -> str:
    return resources.files("vaswani.serve").joinpath("page", name).read_text(encoding="utf-8")


async def _scored(server: Server, name: str, run: Run, ids: list[int], top: int | None
                  ) -> list:
    """Echo's log-probabilities of a prompt's tokens (the first has none), computed in the
    models' thread; none asked for (``top`` None): placeholders."""
    if top is None:
        return [(None, None)] * len(ids)
    return [(None, None), *await server.call(name, lambda: run.token_logprobs(ids, top))]


async def _result(generation: Generation, http: HTTPRequest) -> dict:
    await until(generation.done, http.is_disconnected, generation.cancel)
    return generation.result()
