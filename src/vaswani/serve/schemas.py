"""Request bodies of the HTTP API (pydantic; a bad field is a 4xx naming it).

``/v1/completions``, ``/v1/chat/completions`` and ``/v1/embeddings`` take OpenAI's fields (and
a few of vaswani's decoding controls besides); ``/v1/translate``, ``/v1/classify`` and
``/v1/attention`` are vaswani's own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_ITEMS = 64  # texts or prompts in one request


class Request(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we do not use

    model: str = Field(min_length=1)


class Controls(BaseModel):
    """Decoding controls beyond OpenAI's (all optional: the run's [decode] otherwise)."""

    top_k: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0)
    no_repeat_ngram_size: int | None = Field(default=None, ge=0)
    min_tokens: int | None = Field(default=None, ge=0)


class Generation(Request, Controls):
    """The fields completions and chat share (OpenAI's)."""

    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    stream: bool = False


class CompletionRequest(Generation):
    prompt: str | list[str]


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(Generation):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class EmbeddingRequest(Request):
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"


class TranslateRequest(Request):
    input: str | list[str]
    beam: int | None = Field(default=None, ge=1)
    n_best: int = Field(default=1, ge=1)
    length_penalty: float | None = Field(default=None, ge=0)
    no_repeat_ngram_size: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0)
    min_length: int | None = Field(default=None, ge=0)


class ClassifyRequest(Request):
    input: str | list[str]


class AttentionRequest(Request):
    input: str
    target: str | None = None
