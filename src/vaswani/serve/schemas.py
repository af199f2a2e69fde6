"""Request bodies of the HTTP API (pydantic; a bad field is a 422 naming it).

``/v1/completions``, ``/v1/chat/completions`` and ``/v1/embeddings`` take OpenAI's fields (and
a few of vaswani's decoding controls besides); ``/v1/translate``, ``/v1/classify`` and
``/v1/attention`` are vaswani's own.

No field is ignored silently. Every field a body may carry is one of: a field the server
implements (declared below); one of OpenAI's that changes nothing on a local server
(:data:`NO_OPS`: accepted, and listed in docs/reference/http.md); or refused with a 400 that
names it and says what the server does instead (:data:`REFUSED`, and any other name:
:func:`unimplemented`). A refused field given its default value (``logit_bias: {}``,
``best_of`` equal to ``n``) asks for nothing and is accepted.

Every field is bounded here, before any model sees it: numbers have a range (NaN and infinity
are refused), a seed fits in 63 bits, and a text must be encodable (JSON can spell a lone
surrogate, ``"\\ud800"``, which no tokenizer takes). Whole numbers and flags are strict: JSON's
``true`` is not the number 1 (``logprobs: true`` on /v1/completions, whose logprobs is a
count), nor ``504.0`` a token id.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
)

from ..config.sections import MAX_BEAM, MAX_NEW_TOKENS, MAX_SEED

MAX_ITEMS = 64  # texts or prompts in one request
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's chat allows 20; vLLM's legacy too)
MAX_SCHEMA_CHARS = 65_536  # a response_format's JSON schema, as JSON text

# OpenAI's fields that change nothing on a local server: accepted, never acted on
NO_OPS = {"user": "an end-user id for abuse monitoring", "store": "storing outputs for "
          "OpenAI's dashboard", "metadata": "tags for stored outputs", "service_tier": "a "
          "processing tier", "prompt_cache_key": "a cache-routing hint",
          "safety_identifier": "an end-user id for abuse monitoring"}
# OpenAI's fields the server does not implement: what it does instead
REFUSED = {
    "tools": "tool calling is /v1/chat/completions's",
    "tool_choice": "tool calling is /v1/chat/completions's",
    "parallel_tool_calls": "tool calling is /v1/chat/completions's",
    "functions": "the deprecated functions: use tools",
    "function_call": "the deprecated function_call: use tool_choice",
    "logit_bias": "no biases; repetition_penalty, presence_penalty and frequency_penalty "
                  "are the controls there are",
    "suffix": "no insertion: the prompt is continued at its end",
    "best_of": "no server-side ranking: n completions are returned, each scored with "
               "logprobs",
    "modalities": "text only", "audio": "text only",
    "prediction": "no predicted outputs", "reasoning_effort": "not a reasoning model",
    "verbosity": "no verbosity control: say it in the prompt",
    "web_search_options": "no web search", "logprobs_bias": "no biases",
}
# the value of a refused field that asks for nothing (its default)
HARMLESS = {"logit_bias": lambda v: not v, "functions": lambda v: not v,
            "tools": lambda v: not v, "tool_choice": lambda v: v in ("none", None),
            "parallel_tool_calls": lambda v: v in (True, None),
            "modalities": lambda v: v in (["text"], None)}


def unimplemented(extra: dict, body: BaseModel) -> list[tuple[str, str]]:
    """Every field of ``extra`` (a body's fields beyond its model's) the server refuses:
    (its name, what the server does instead); none if all are no-ops or harmless."""
    refused = []
    for name, value in extra.items():
        if name in NO_OPS or HARMLESS.get(name, lambda v: False)(value):
            continue
        if name == "best_of" and value in (None, getattr(body, "n", 1)):
            continue
        refused.append((name, REFUSED.get(name, f"{type(body).__name__} has no field "
                                                f"{name!r}")))
    return refused


def encodable(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"holds a character that is not valid Unicode text "
                         f"(U+{ord(text[e.start]):04X}, a lone surrogate, at {e.start})") from None
    return text


def bounded(schema: dict) -> dict:
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise ValueError(f"a JSON schema of at most {MAX_SCHEMA_CHARS:,} characters")
    return schema


Text = Annotated[str, AfterValidator(encodable)]
Count = Annotated[StrictInt, Field(ge=0, le=MAX_NEW_TOKENS)]


class ErrorBody(BaseModel):
    """Every answer other than 2xx: ``{"error": {"message", "type", "param", "code"}}``, as
    OpenAI's."""

    class Error(BaseModel):
        message: str
        type: str
        param: str | None = None
        code: str | None = None

    error: Error


class Body(BaseModel):
    """What every request body holds: the model it asks. Fields beyond a route's own are
    kept (``model_extra``) for the route to accept as no-ops or refuse by name."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: Text = Field(min_length=1)


class Controls(BaseModel):
    """Decoding controls beyond OpenAI's (all optional: the run's [decode] otherwise)."""

    top_k: StrictInt | None = Field(default=None, ge=0, le=1_000_000)
    repetition_penalty: float | None = Field(default=None, gt=0, le=100)
    no_repeat_ngram_size: StrictInt | None = Field(default=None, ge=0, le=64)
    min_tokens: Count | None = None


class JSONSchemaFormat(BaseModel):
    """``response_format.json_schema``: a named JSON schema (OpenAI's fields)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: Text | None = None
    schema_: Annotated[dict, AfterValidator(bounded)] | None = Field(default=None,
                                                                     alias="schema")
    strict: StrictBool | None = None  # the output keeps to the schema either way


class TextFormat(BaseModel):
    """``response_format: {"type": "text"}``: free text (the default)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]


class JSONObjectFormat(BaseModel):
    """``{"type": "json_object"}``: one JSON object, any keys."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["json_object"]


class JSONSchemaResponse(BaseModel):
    """``{"type": "json_schema", "json_schema": {...}}``: JSON that the schema accepts."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["json_schema"]
    json_schema: JSONSchemaFormat


# response_format: free text, any JSON object, or JSON that a schema accepts (OpenAI's)
ResponseFormat = Annotated[TextFormat | JSONObjectFormat | JSONSchemaResponse,
                           Field(discriminator="type")]


class GenerationBody(Body, Controls):
    """The fields completions and chat share (OpenAI's)."""

    max_tokens: StrictInt | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: StrictInt = Field(default=1, ge=1, le=MAX_ITEMS)
    stop: Text | list[Text] | None = None
    seed: StrictInt | None = Field(default=None, ge=0, le=MAX_SEED)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    stream: StrictBool = False
    response_format: ResponseFormat | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False  # a last chunk with the usage, before [DONE]


TokenIds = list[Annotated[StrictInt, Field(ge=0, le=2**31 - 1)]]


def _ids_as_written(prompt):
    """A list prompt's numbers must be token ids as written: not ``504.0``, not ``true``."""
    for item in prompt if isinstance(prompt, list) else []:
        for i, x in enumerate(item if isinstance(item, list) else [item]):
            if isinstance(x, bool | float):
                raise ValueError(f"a token id is a whole number written without a fraction, "
                                 f"not {json.dumps(x)} (at {i})")
    return prompt


class CompletionRequest(GenerationBody):
    prompt: Annotated[Text | list[Text] | TokenIds | list[TokenIds],
                      BeforeValidator(_ids_as_written)]
    max_tokens: StrictInt | None = Field(default=None, ge=0, le=MAX_NEW_TOKENS)  # 0: echo
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)  # a count
    echo: StrictBool = False
    stream_options: StreamOptions | None = None


class Message(BaseModel):
    """A system's or user's message."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")  # a field never ignored

    role: Literal["system", "user"]
    content: Text


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Text
    arguments: Text  # JSON text, as OpenAI writes it


class ToolCall(BaseModel):
    """A call an assistant's message made (sent back in the conversation)."""

    model_config = ConfigDict(extra="forbid")

    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    """The assistant's earlier answer: its text, or the tools it called."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    role: Literal["assistant"]
    content: Text | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=MAX_ITEMS)


class ToolMessage(BaseModel):
    """What a tool answered to a call."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    role: Literal["tool"]
    content: Text
    tool_call_id: Text


Turn = Annotated[Message | AssistantMessage | ToolMessage, Field(discriminator="role")]


class Function(BaseModel):
    """A tool: a function the model may call (OpenAI's fields)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: Text | None = None
    parameters: Annotated[dict, AfterValidator(bounded)] | None = None  # a JSON schema
    strict: StrictBool | None = None  # the arguments keep to the schema either way


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: Function


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Text


class NamedToolChoice(BaseModel):
    """``tool_choice`` naming the one function to call."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: NamedFunction


class ChatRequest(GenerationBody):
    messages: list[Turn] = Field(min_length=1, max_length=1024)
    tools: list[Tool] | None = Field(default=None, max_length=MAX_ITEMS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True  # False: one call at most
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    stream_options: StreamOptions | None = None


class EmbeddingRequest(Body):
    input: Text | list[Text]
    encoding_format: Literal["float", "base64"] = "float"


class TranslateRequest(Body):
    input: Text | list[Text]
    beam: StrictInt | None = Field(default=None, ge=1, le=MAX_BEAM)
    n_best: StrictInt = Field(default=1, ge=1, le=MAX_BEAM)
    length_penalty: float | None = Field(default=None, ge=0, le=10)
    no_repeat_ngram_size: StrictInt | None = Field(default=None, ge=0, le=64)
    repetition_penalty: float | None = Field(default=None, gt=0, le=100)
    min_length: Count | None = None


class ClassifyRequest(Body):
    input: Text | list[Text]


class AttentionRequest(Body):
    input: Text
    target: Text | None = None
