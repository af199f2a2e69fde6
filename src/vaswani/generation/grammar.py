"""Output held to a JSON schema, token by token (structured output).

A language model may follow any token with any other; a grammar says which tokens can
continue the text so far into text it accepts. Before each token is chosen, every token
that cannot is masked out (its score set to -inf), so whatever is chosen, greedily or by
sampling, the text stays inside the grammar, and ``<eos>`` is allowed only where the text is
complete. Where the grammar leaves one token, that one is chosen; where it leaves many, the
model's own scores choose among them.

The grammar engine is llguidance (PyPI ``llguidance``; also the one of vLLM, SGLang and
llama.cpp): it compiles a JSON schema to a grammar over the tokenizer's bytes and computes a
token mask in tens of microseconds, over any vocabulary (it reads the tokenizer's own
``tokenizer.json``, or the bytes of each token), and has no dependency of its own.
Each tokenizer is read once, and each schema compiled once per tokenizer (the last
:data:`KEPT` kept); a request gets a copy of the compiled matcher, which follows its tokens.

The JSON is written with ``", "`` between items and ``": "`` after keys, as Python's
``json.dumps`` writes it, and no other whitespace: a model's tokens go to the content.

Tool calls are held the same way (:meth:`Grammars.tool_calls`), in the format of Hermes'
templates that Qwen2, Qwen2.5 and SmolLM3 use: ``<tool_call>``, a newline, the call as JSON
(``{"name": ..., "arguments": ...}``, the arguments as the tool's parameters schema says), a
newline, ``</tool_call>``. Where the tokenizer has the two markers as tokens of their own
(those models' do), the grammar asks for those tokens, as the model learnt to write them.
"""

from __future__ import annotations

import functools
import json
import weakref

import numpy as np
import torch
from torch import Tensor

KEPT = 128  # compiled schemas kept per tokenizer
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT = {"type": "object"}  # OpenAI's response_format json_object: any JSON object
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"  # Hermes' markers around a call


class GrammarError(ValueError):
    """A schema the grammar engine cannot compile; the message says why."""


class Constraint:
    """One request's grammar, following its tokens: which tokens may come next
    (:meth:`allowed`), and whether the text is complete (:attr:`finished`)."""

    def __init__(self, matcher, vocab_size: int) -> None:
        self.matcher, self.vocab_size = matcher, vocab_size

    def allowed(self, width: int) -> Tensor:
        """(width,) bool: the tokens that may come next (False past the tokenizer's
        vocabulary, where a model's output is wider)."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[:min(width, self.vocab_size)]
        mask = torch.zeros(width, dtype=torch.bool)
        mask[:len(allowed)] = torch.from_numpy(allowed.astype(bool))
        return mask

    def consume(self, token: int) -> None:
        """Follow ``token`` (one :meth:`allowed` allowed)."""
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"token {token} breaks the grammar: "
                               f"{self.matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """Whether the text is complete and nothing may follow it (but ``<eos>``)."""
        return self.matcher.is_stopped()


class Grammars:
    """A tokenizer as the grammar engine reads it, and the JSON schemas compiled for it."""

    def __init__(self, tokenizer) -> None:
        try:
            import llguidance
        except ImportError:
            raise ImportError("structured output needs llguidance: pip install "
                              "llguidance (it comes with vaswani)") from None
        self.llguidance = llguidance
        self.vocab_size = tokenizer.vocab_size
        hf = getattr(tokenizer, "hf", None)  # a Hugging Face tokenizer: its own JSON
        source = hf.to_str() if hf is not None else \
            llguidance.TokenizerWrapper(ByteTokens(tokenizer))
        self.tokenizer = llguidance.LLTokenizer(source, n_vocab=tokenizer.vocab_size,
                                                eos_token=tokenizer.eos_id)
        self.token_id = hf.token_to_id if hf is not None else lambda text: None
        self.compiled = functools.lru_cache(maxsize=KEPT)(self._compile)

    def constraint(self, schema: dict | None = None) -> Constraint:
        """A new request's :class:`Constraint` for JSON that ``schema`` (a JSON schema;
        None: any JSON object) accepts. Raises :class:`GrammarError` for a schema that
        cannot be compiled."""
        text = json.dumps(ANY_OBJECT if schema is None else schema)  # (its order: the keys')
        return Constraint(self.compiled("json", text).deep_copy(), self.vocab_size)

    def tool_calls(self, tools: list[dict], choice: str, parallel: bool = True) -> Constraint:
        """A new request's :class:`Constraint` for calls of ``tools`` (each OpenAI's
        ``function``: ``name``, ``parameters``): ``choice`` "auto" (text, in which each call
        keeps to its tool's schema), "required" (one call or more, nothing else) or a tool's
        name (one call of it); ``parallel`` False: one call at most."""
        def marker(text: str) -> str:
            i = self.token_id(text)
            return f"<[{i}]>" if i is not None else json.dumps(text)

        chosen = [t for t in tools if choice in ("auto", "required", t["name"])]
        calls = {"anyOf": [{"type": "object", "properties": {
            "name": {"const": t["name"]}, "arguments": t.get("parameters") or ANY_OBJECT},
            "required": ["name", "arguments"], "additionalProperties": False}
            for t in chosen], "x-guidance": LAYOUT}
        call = f'{marker(TOOL_OPEN)} "\\n" %json {json.dumps(calls)} "\\n" {marker(TOOL_CLOSE)}'
        if choice == "auto":  # text, with calls in it
            calls_in_text = "(tagged)*" if parallel else "(tagged)?"
            lark = f"start: {calls_in_text} TEXT\ntagged: TEXT call\nTEXT: /(.|\\n)*/\n" \
                   f"call: {call}\n"
        elif choice == "required" and parallel:
            lark = f'start: call ("\\n" call)*\ncall: {call}\n'
        else:
            lark = f"start: {call}\n"
        return Constraint(self.compiled("lark", "%llguidance {}\n" + lark).deep_copy(),
                          self.vocab_size)

    def _compile(self, kind: str, text: str):
        """A grammar's matcher: ``kind`` "json" (``text`` a JSON schema) or "lark"."""
        LLMatcher = self.llguidance.LLMatcher
        try:
            grammar = LLMatcher.grammar_from_json_schema(text, defaults=LAYOUT) \
                if kind == "json" else LLMatcher.grammar_from_lark(text)
        except ValueError as e:
            raise GrammarError(f"the JSON schema cannot be read: {e}") from None
        matcher = LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            what = "JSON schema" if kind == "json" else "tools' grammar"
            raise GrammarError(f"the {what} cannot be compiled: {matcher.get_error()}")
        return matcher


class ByteTokens:
    """A tokenizer without a Hugging Face JSON (vaswani's character tokenizer) as llguidance
    reads one: each token's bytes, and which tokens are special."""

    def __init__(self, tokenizer) -> None:
        self.tokens = [tokenizer.token(i).encode() for i in range(tokenizer.vocab_size)]
        self.special_token_ids = sorted({tokenizer.pad_id, tokenizer.bos_id,
                                         tokenizer.eos_id, tokenizer.unk_id})
        self.eos_token_id, self.bos_token_id = tokenizer.eos_id, tokenizer.bos_id
        self.encode = tokenizer.encode

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # (llguidance then hands it text, not bytes)
            raise TypeError("a text is tokenized, not bytes")
        return self.encode(text)


_grammars: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def grammars(tokenizer) -> Grammars:
    """``tokenizer``'s :class:`Grammars`, made once (reading a vocabulary of 50,000 tokens
    takes a moment)."""
    if tokenizer not in _grammars:
        _grammars[tokenizer] = Grammars(tokenizer)
    return _grammars[tokenizer]
