"""Request bodies of the HTTP API (pydantic; a bad field is a 422 naming it).

``/v1/completions``, ``/v1/chat/completions`` and ``/v1/embeddings`` take OpenAI's fields (and
a few of vaswani's decoding controls besides); ``/v1/translate``, ``/v1/classify`` and
``/v1/attention`` are vaswani's own.

Every field is bounded here, before any model sees it: numbers have a range (NaN and infinity
are refused), a seed fits in 63 bits, and a text must be encodable (JSON can spell a lone
surrogate, ``"\\ud800"``, which no tokenizer takes).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ..config.sections import MAX_BEAM, MAX_NEW_TOKENS, MAX_SEED

MAX_ITEMS = 64  # texts or prompts in one request


def encodable(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"holds a character that is not valid Unicode text "
                         f"(U+{ord(text[e.start]):04X}, a lone surrogate, at {e.start})") from None
    return text


Text = Annotated[str, AfterValidator(encodable)]
Count = Annotated[int, Field(ge=0, le=MAX_NEW_TOKENS)]


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
    """What every request body holds: the model it asks."""

    model_config = ConfigDict(extra="ignore",  # OpenAI clients send fields we do not use
                              allow_inf_nan=False)

    model: Text = Field(min_length=1)


class Controls(BaseModel):
    """Decoding controls beyond OpenAI's (all optional: the run's [decode] otherwise)."""

    top_k: int | None = Field(default=None, ge=0, le=1_000_000)
    repetition_penalty: float | None = Field(default=None, gt=0, le=100)
    no_repeat_ngram_size: int | None = Field(default=None, ge=0, le=64)
    min_tokens: Count | None = None


class GenerationBody(Body, Controls):
    """The fields completions and chat share (OpenAI's)."""

    max_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=MAX_ITEMS)
    stop: Text | list[Text] | None = None
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    stream: bool = False


class CompletionRequest(GenerationBody):
    prompt: Text | list[Text]


class Message(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    role: Literal["system", "user", "assistant"]
    content: Text


class ChatRequest(GenerationBody):
    messages: list[Message] = Field(min_length=1, max_length=1024)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)


class EmbeddingRequest(Body):
    input: Text | list[Text]
    encoding_format: Literal["float", "base64"] = "float"


class TranslateRequest(Body):
    input: Text | list[Text]
    beam: int | None = Field(default=None, ge=1, le=MAX_BEAM)
    n_best: int = Field(default=1, ge=1, le=MAX_BEAM)
    length_penalty: float | None = Field(default=None, ge=0, le=10)
    no_repeat_ngram_size: int | None = Field(default=None, ge=0, le=64)
    repetition_penalty: float | None = Field(default=None, gt=0, le=100)
    min_length: Count | None = None


class ClassifyRequest(Body):
    input: Text | list[Text]


class AttentionRequest(Body):
    input: Text
    target: Text | None = None
