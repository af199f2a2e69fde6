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

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from ..inference import Run
from . import chat, openai, schemas
from .server import Generation, Limits, Server, until


class ApiError(Exception):
    """An answer other than 2xx: its HTTP status, message, type and the field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


async def the_server(request: Request) -> Server:
    return request.app.state.server


async def authorised(request: Request) -> None:
    key = request.app.state.api_key
    if key and request.headers.get("authorization") != f"Bearer {key}":
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
async def health(request: Request, server: TheServer):
    return {"status": "ok", "models": list(server.runs),
            "auth": bool(request.app.state.api_key),
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
async def translate(body: schemas.TranslateRequest, request: Request, server: TheServer):
    _implemented(body)
    run = server.run_for(body.model, "translate")
    texts = _texts(body.input, server.limits)
    _fits(run, body.model, texts, body.input)
    decode = _decode(run, beam=body.beam, n_best=body.n_best,
                     length_penalty=body.length_penalty,
                     no_repeat_ngram_size=body.no_repeat_ngram_size,
                     repetition_penalty=body.repetition_penalty,
                     min_length=body.min_length)
    results = await server.translate(body.model, texts, decode, request.is_disconnected)
    return {"object": "list", "model": body.model, "data": [
        {"index": i, "translations": [{"text": t, "score": s} for t, s in hyps]}
        for i, hyps in enumerate(results)]}


@api.post("/classify")
async def classify(body: schemas.ClassifyRequest, request: Request, server: TheServer):
    _implemented(body)
    run = server.run_for(body.model, "classify")
    if not run.labels:
        raise ApiError(400, f"model {body.model!r} has no classification head (an "
                       "imported encoder): use /v1/embeddings", "model")
    texts = _texts(body.input, server.limits)
    _fits(run, body.model, texts, body.input)
    results = await server.encode(body.model, "classify", texts, request.is_disconnected)
    return {"object": "list", "model": body.model, "data": [
        {"index": i, "label": max(p, key=p.get), "probability": max(p.values()),
         "probabilities": p} for i, p in enumerate(results)]}


@api.post("/embeddings")
async def embeddings(body: schemas.EmbeddingRequest, request: Request, server: TheServer):
    _implemented(body)
    run = server.run_for(body.model, "embeddings")
    texts = _texts(body.input, server.limits)
    _fits(run, body.model, texts, body.input)
    vectors = await server.encode(body.model, "embed", texts, request.is_disconnected)
    n_tokens = sum(len(run.source_tokenizer.encode(t)) for t in texts)
    return {"object": "list", "model": body.model, "data": [
        {"object": "embedding", "index": i, "embedding": openai.vector(v, body.encoding_format)}
        for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


@api.post("/completions")
async def completions(body: schemas.CompletionRequest, request: Request, server: TheServer):
    _implemented(body)
    run = server.run_for(body.model, "completions")
    prompts = _prompts(server, run, body.prompt)
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
        choices, usage = openai.choices(results, body.n, chat_mode=False, tokenizer=tok,
                                        logprobs=keep, echo=echo)
        return _completion_answer(body.model, choices, usage)
    decode = _decoding(server, run, body, body.max_tokens, len(prompts))
    generations = server.generate(body.model, prompts, decode, n=body.n, seed=body.seed,
                                  stream=body.stream, logprobs=body.logprobs)
    if body.stream:
        return openai.sse(generations[0], request, body.model, "text_completion",
                          chat_mode=False, tokenizer=tok, logprobs=keep,
                          echo=echo[0] if echo else None, usage=_usage(body))
    results = [await _result(g, request) for g in generations]
    choices, usage = openai.choices(results, body.n, chat_mode=False, tokenizer=tok,
                                    logprobs=keep, echo=echo)
    return _completion_answer(body.model, choices, usage)


def _completion_answer(model: str, choices: list, usage: dict) -> dict:
    return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion",
            "created": int(time.time()), "model": model, "choices": choices, "usage": usage}


@api.post("/chat/completions")
async def chat_completions(body: schemas.ChatRequest, request: Request, server: TheServer):
    _implemented(body)
    run = server.run_for(body.model, "chat")
    if run.chat_template is None:
        raise ApiError(400, f"model {body.model!r} has no chat template (a model trained "
                       "with vaswani has none); use /v1/completions with a plain prompt",
                       "model")
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    tok = run.source_tokenizer
    try:
        prompt = chat.render(run.chat_template, [m.model_dump() for m in body.messages],
                             bos_token=tok.token(tok.bos_id), eos_token=tok.token(tok.eos_id))
    except chat.TemplateError as e:
        raise ApiError(400, str(e), "messages") from None
    _check_length(prompt, server.limits, "messages")
    decode = _decoding(server, run, body, body.max_completion_tokens or body.max_tokens, 1)
    top = (body.top_logprobs or 0) if body.logprobs else None
    [generation] = server.generate(body.model, [(prompt, _prompt_ids(server, run, prompt))],
                                   decode, n=body.n, seed=body.seed, stream=body.stream,
                                   logprobs=top)
    if body.stream:
        return openai.sse(generation, request, body.model, "chat.completion.chunk",
                          chat_mode=True, tokenizer=tok, logprobs=body.logprobs,
                          usage=_usage(body))
    choices, usage = openai.choices([await _result(generation, request)], body.n,
                                    chat_mode=True, tokenizer=tok, logprobs=body.logprobs)
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
            "created": int(time.time()), "model": body.model, "choices": choices,
            "usage": usage}


@api.post("/attention")
async def attention(body: schemas.AttentionRequest, server: TheServer):
    _implemented(body)
    run = server.run_for(body.model, "attention")
    for name, text in (("input", body.input), ("target", body.target)):
        if text is None:
            continue
        _check_length(text, server.limits, name)
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


def _fits(run: Run, name: str, texts: list[str], given: str | list[str]) -> None:
    """A 400 for a text the model would have to cut (its ``max_len``): nothing is answered
    about a text the model did not read whole."""
    counts = run.input_tokens(texts)
    if not counts:
        return
    i = max(range(len(counts)), key=counts.__getitem__)
    limit = run.config.model.max_len
    if counts[i] > limit:
        where = "input" if isinstance(given, str) else f"input[{i}]"
        raise ApiError(400, f"{where} is {counts[i]:,} tokens (special tokens included); model "
                       f"{name!r} reads at most {limit:,} (its max_len): shorten it or split "
                       "it", "input")


def _decode(run: Run, **given):
    try:
        return run.decode_options(**given)
    except ValueError as e:
        raise ApiError(400, str(e)) from None


def _decoding(server: Server, run: Run, body, max_tokens: int | None, prompts: int):
    """The decoding settings of a completion or chat request, checked against the limits
    (``prompts`` prompts, ``body.n`` completions each)."""
    limits = server.limits
    if body.stream_options is not None and not body.stream:  # as OpenAI answers
        raise ApiError(400, "stream_options is only allowed when stream is true",
                       "stream_options")
    if body.n > limits.max_n:
        raise ApiError(400, f"n ({body.n}) is over the limit of {limits.max_n}", "n")
    if prompts * body.n > server.max_queue:
        raise ApiError(400, f"{prompts} prompt(s) x n ({body.n}) is {prompts * body.n} "
                       f"completions; the server queues at most {server.max_queue} for a "
                       "model: send fewer at a time", "n")
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise ApiError(400, f"max_tokens ({max_tokens}) is over the limit of "
                       f"{limits.max_tokens}", "max_tokens")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return _decode(run, max_new_tokens=max_tokens, temperature=body.temperature,
                   top_p=body.top_p, top_k=body.top_k, stop=stop,
                   presence_penalty=body.presence_penalty,
                   frequency_penalty=body.frequency_penalty,
                   repetition_penalty=body.repetition_penalty,
                   no_repeat_ngram_size=body.no_repeat_ngram_size, min_length=body.min_tokens)


def _implemented(body) -> None:
    """A 400 for a field the server does not implement (schemas.py says which are no-ops),
    naming it and what the server does instead: no field is ignored silently."""
    refused = schemas.unimplemented(body.model_extra or {}, body)
    if len(refused) == 1:
        name, instead = refused[0]
        raise ApiError(400, f"{name} is not implemented by this server: {instead}", name)
    if refused:
        raise ApiError(400, f"{', '.join(n for n, _ in refused)} are not implemented by this "
                       f"server: {'; '.join(f'{n}: {why}' for n, why in refused)}",
                       refused[0][0])



def _usage(body) -> bool:
    return body.stream_options is not None and body.stream_options.include_usage


def _prompts(server: Server, run: Run, prompt) -> list[tuple[str, list[int]]]:
    """A completion's prompts, each (text, tokens): texts are encoded, token ids (a list, or
    a list of lists, as OpenAI and vLLM take them) checked against the vocabulary and
    decoded for the answer's text; every one within the limits."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        prompt = [prompt]
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], str)):
        return [(p, _prompt_ids(server, run, p))
                for p in _texts(prompt, server.limits, allow_empty=True)]
    if not prompt:
        raise ApiError(400, "prompt is an empty list", "prompt")
    if len(prompt) > server.limits.max_items:
        raise ApiError(400, f"prompt has {len(prompt)} items; the limit is "
                       f"{server.limits.max_items}", "prompt")
    tok, out = run.source_tokenizer, []
    for i, ids in enumerate(prompt):
        if not ids:
            raise ApiError(400, f"prompt[{i}] is an empty list of tokens", "prompt")
        if max(ids) >= tok.vocab_size:
            raise ApiError(400, f"prompt[{i}] holds token {max(ids)}; the vocabulary has "
                           f"{tok.vocab_size} (0 .. {tok.vocab_size - 1})", "prompt")
        _check_prompt(server, run, len(ids), f"prompt[{i}]")
        out.append((tok.decode(list(ids)), list(ids)))
    return out


async def _scored(server: Server, name: str, run: Run, ids: list[int], top: int | None
                  ) -> list:
    """Echo's log-probabilities of a prompt's tokens (the first has none), computed in the
    models' thread; none asked for (``top`` None): placeholders."""
    if top is None:
        return [(None, None)] * len(ids)
    return [(None, None), *await server.call(name, lambda: run.token_logprobs(ids, top))]


def _prompt_ids(server: Server, run: Run, prompt: str) -> list[int]:
    """A prompt's tokens (counted here, and not made again), within the limits."""
    ids = run.source_tokenizer.encode_prompt(prompt)
    _check_prompt(server, run, len(ids), "the prompt")
    return ids


def _check_prompt(server: Server, run: Run, n: int, what: str) -> None:
    """A 400 for a prompt over the server's limit, or longer than the model reads (the
    library would continue from its last half window: a server answers nothing about a
    prompt it did not read whole)."""
    if n > server.limits.max_prompt_tokens:
        raise ApiError(400, f"{what} is {n:,} tokens; the limit is "
                       f"{server.limits.max_prompt_tokens:,}", "prompt")
    if n > run.config.model.max_len:
        raise ApiError(400, f"{what} is {n:,} tokens; the model reads at most "
                       f"{run.config.model.max_len:,} (its max_len)", "prompt")


async def _result(generation: Generation, request: Request) -> dict:
    await until(generation.done, request.is_disconnected, generation.cancel)
    return generation.result()
