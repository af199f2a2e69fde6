"""A request body read into what the server works with: its texts and prompts (text and
tokens) within the limits, its decoding settings, the grammar its output keeps to; or an
:class:`ApiError`, an answer other than 2xx that names the field at fault (routes.py's
routes call these; app.py answers the errors)."""

from __future__ import annotations

import asyncio

from ..generation.grammar import ANY_OBJECT, TOOL_CLOSE, TOOL_OPEN, GrammarError
from ..inference import Run
from . import chat, schemas
from .server import Limits, Server


class ApiError(Exception):
    """An answer other than 2xx: its HTTP status, message, type and the field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def check_length(text: str, limits: Limits, param: str) -> None:
    if len(text) > limits.max_input_chars:
        raise ApiError(400, f"{param} is {len(text):,} characters; the limit is "
                       f"{limits.max_input_chars:,}", param)


def texts(value: str | list[str], limits: Limits, *, allow_empty: bool = False) -> list[str]:
    texts = [value] if isinstance(value, str) else list(value)
    if not texts:
        raise ApiError(400, "input is an empty list", "input")
    if len(texts) > limits.max_items:
        raise ApiError(400, f"input has {len(texts)} items; the limit is {limits.max_items}",
                       "input")
    for text in texts:
        check_length(text, limits, "input")
        if not allow_empty and not text.strip():
            raise ApiError(400, "input holds an empty text", "input")
    return texts


def fits(run: Run, name: str, texts: list[str], given: str | list[str]) -> None:
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


def decode(run: Run, **given):
    try:
        return run.decode_options(**given)
    except ValueError as e:
        raise ApiError(400, str(e)) from None


def decoding(server: Server, run: Run, body, max_tokens: int | None, prompts: int):
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
    return decode(run, max_new_tokens=max_tokens, temperature=body.temperature,
                   top_p=body.top_p, top_k=body.top_k, stop=stop,
                   presence_penalty=body.presence_penalty,
                   frequency_penalty=body.frequency_penalty,
                   repetition_penalty=body.repetition_penalty,
                   no_repeat_ngram_size=body.no_repeat_ngram_size, min_length=body.min_tokens)


def implemented(body) -> None:
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



def usage(body) -> bool:
    return body.stream_options is not None and body.stream_options.include_usage


def prompts(server: Server, run: Run, prompt) -> list[tuple[str, list[int]]]:
    """A completion's prompts, each (text, tokens): texts are encoded, token ids (a list, or
    a list of lists, as OpenAI and vLLM take them) checked against the vocabulary and
    decoded for the answer's text; every one within the limits."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        prompt = [prompt]
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], str)):
        return [(p, prompt_ids(server, run, p))
                for p in texts(prompt, server.limits, allow_empty=True)]
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
        check_prompt(server, run, len(ids), f"prompt[{i}]")
        out.append((tok.decode(list(ids)), list(ids)))
    return out


def prompt_ids(server: Server, run: Run, prompt: str) -> list[int]:
    """A prompt's tokens (counted here, and not made again), within the limits."""
    ids = run.source_tokenizer.encode_prompt(prompt)
    check_prompt(server, run, len(ids), "the prompt")
    return ids


def check_prompt(server: Server, run: Run, n: int, what: str) -> None:
    """A 400 for a prompt over the server's limit, or longer than the model reads (the
    library would continue from its last half window: a server answers nothing about a
    prompt it did not read whole)."""
    if n > server.limits.max_prompt_tokens:
        raise ApiError(400, f"{what} is {n:,} tokens; the limit is "
                       f"{server.limits.max_prompt_tokens:,}", "prompt")
    if n > run.config.model.max_len:
        raise ApiError(400, f"{what} is {n:,} tokens; the model reads at most "
                       f"{run.config.model.max_len:,} (its max_len)", "prompt")


async def constraint(run: Run, body, tool_choice: str | None = None,
                     functions: list[dict] = ()):
    """What a completion's output keeps to, as a maker of each request's constraint (None:
    free text): the JSON schema of ``response_format``, or calls of ``functions`` as
    ``tool_choice`` and ``parallel_tool_calls`` allow them (tools.py). Compiled here, before
    any request is queued (the first time in a worker thread: reading a large vocabulary
    takes a moment); a 400 naming the field when it cannot be."""
    given = getattr(body, "response_format", None)
    wants_json = given is not None and given.type != "text"
    if tool_choice is not None:
        if wants_json:
            raise ApiError(400, "response_format holds the answer to JSON and tools to calls: "
                           "ask for one", "response_format")
        parallel = body.parallel_tool_calls
        make, param = (lambda: run.tool_constraint(functions, tool_choice, parallel)), "tools"
    elif wants_json:
        schema = dict(ANY_OBJECT) if given.type == "json_object" else \
            (given.json_schema.schema_ or {})  # no schema: any JSON value
        make, param = (lambda: run.constraint(schema)), "response_format"
    else:
        return None
    try:
        await asyncio.to_thread(make)
    except GrammarError as e:
        raise ApiError(400, str(e), param) from None
    return make


def check_tools(run: Run, name: str, tool_choice: str, functions: list[dict]) -> None:
    """A 400 for tools this model cannot be asked to call: its template writes no tools, or
    not in the format the server reads calls in; or a tool_choice naming none of them."""
    if not chat.takes_tools(run.chat_template):
        raise ApiError(400, f"model {name!r}'s chat template takes no tools: it cannot be "
                       "told of them; leave tools out, or serve a model whose template "
                       "takes them", "tools")
    if TOOL_OPEN not in run.chat_template:
        raise ApiError(400, f"model {name!r}'s chat template does not write calls as "
                       f"{TOOL_OPEN} ... {TOOL_CLOSE}, the format this server reads them in",
                       "tools")
    names = [f["name"] for f in functions]
    if tool_choice not in ("auto", "required", *names):
        raise ApiError(400, f"tool_choice names {tool_choice!r}, which is none of the tools "
                       f"({', '.join(names)})", "tool_choice")
