"""Using a language-model run (decoder): continue a prompt (greedy or sampled, streamed;
one or many at once, on the run's inference engine), score a text (perplexity, bits per
character), and look at its attention."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import DecodeConfig
from ..data.batching import lm_eval_windows
from ..data.files import DataError
from ..engine import Engine, EngineConfig, Request
from ..engine.draft import DraftModel
from ..engine.speculate import lookup
from ..generation.grammar import Constraint, grammars
from ..models.losses import smoothed_cross_entropy
from .base import Run
from .inside import as_batch, attention_map, next_token_probabilities, token_labels


class LanguageModel(Run):
    produces_outputs = False  # evaluation scores the text itself
    decodes = True
    draft: LanguageModel | None = None  # guesses for speculating requests (set_draft)

    def set_draft(self, draft: LanguageModel | None) -> None:
        """Guess with ``draft`` (a smaller language model of the same vocabulary, on the
        same device: engine/draft.py) where requests speculate (``--speculate``), instead of
        looking guesses up in the context; None: look them up. The output stays this
        model's, token for token. Raises ValueError for a draft of another kind or
        vocabulary."""
        if draft is not None:
            if not isinstance(draft, LanguageModel):
                raise ValueError(f"{draft.run_dir} holds {draft.describes}; a draft is a "
                                 "language model")
            if vocabulary(draft.source_tokenizer) != vocabulary(self.source_tokenizer):
                raise ValueError(f"{draft.run_dir}'s vocabulary is not {self.run_dir}'s: a "
                                 "draft guesses token ids, so the two must share one")
            if draft.device != self.device:
                raise ValueError(f"the draft {draft.run_dir} is on {draft.device}, "
                                 f"{self.run_dir} on {self.device}")
        self.draft = draft
        if self._engine is not None:
            self._engine.guesser = self._guesser()

    def new_engine(self, config: EngineConfig, fast_prefill: bool | None = None) -> Engine:
        engine = super().new_engine(config, fast_prefill)
        engine.guesser = self._guesser()
        return engine

    def constraint(self, json_schema: dict | None) -> Constraint | None:
        """A new request's grammar: JSON that ``json_schema`` accepts (generation/grammar.py;
        None: no grammar). Raises GrammarError (a ValueError) for a schema that cannot be
        compiled."""
        if json_schema is None:
            return None
        if not isinstance(json_schema, dict):
            raise ValueError(f"json_schema must be a JSON schema (an object), not "
                             f"{type(json_schema).__name__}")
        return grammars(self.source_tokenizer).constraint(json_schema)

    def tool_constraint(self, tools: list[dict], choice: str,
                        parallel: bool = True) -> Constraint:
        """A new request's grammar for calls of ``tools`` (OpenAI's functions: ``name``,
        ``parameters``): ``choice`` "auto", "required" or a tool's name; ``parallel``
        False: one call at most (generation/grammar.py ``Grammars.tool_calls``)."""
        return grammars(self.source_tokenizer).tool_calls(tools, choice, parallel)

    def _guesser(self):
        return lookup if self.draft is None else DraftModel(self.draft.model)

    def generate(self, prompt: str, *, max_new_tokens: int | None = None,
                 temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None,
                 stream: Callable[[str], None] | None = None, json_schema: dict | None = None,
                 **controls) -> str:
        """Continue ``prompt``; ``stream(text)`` receives the new text as it is produced. The
        text ends at ``<eos>``, ``max_new_tokens`` or the first of ``stop``. ``json_schema``:
        the text is JSON that this schema accepts (``{"type": "object"}``: any object;
        generation/grammar.py), ending where the JSON does. ``controls``: any ``[decode]``
        option (``stop``, ``repetition_penalty``, ``no_repeat_ngram_size``, ``min_length``,
        ``presence_penalty``, ...)."""
        decode = self.decode_options(max_new_tokens=max_new_tokens, temperature=temperature,
                                     top_k=top_k, top_p=top_p, **controls)
        return self.continuation(prompt, decode, seed=seed, stream=stream,
                                 constraint=self.constraint(json_schema))

    def generate_many(self, prompts: list[str], *, seed: int | None = None,
                      **options) -> list[str]:
        """:meth:`generate` for many prompts at once (the engine decodes them together, each
        as it would be alone); ``seed`` + i seeds the i-th. ``options``: those of
        :meth:`generate`."""
        decode = self.decode_options(**options)
        completions = [self.completion(p, decode, seed=None if seed is None else seed + i)
                       for i, p in enumerate(prompts)]
        self.engine_for(len(completions)).run([c.request for c in completions],
                                              longest_first=True)
        return [c.result() for c in completions]

    def continuation(self, prompt: str, decode: DecodeConfig, *, seed: int | None = None,
                     stream: Callable[[str], None] | None = None,
                     constraint: Constraint | None = None) -> str:
        """:meth:`generate` with its options already checked."""
        completion = self.completion(prompt, decode, seed=seed, emit=stream,
                                     constraint=constraint)
        self.engine_for(1).run([completion.request])
        return completion.result()

    def completion(self, prompt: str, decode: DecodeConfig, *, seed: int | None = None,
                   emit: Callable[[str], None] | None = None,
                   ids: list[int] | None = None, logprobs: int | None = None,
                   constraint: Constraint | None = None) -> Completion:
        """An engine request to continue ``prompt``, with the text it produces: ``emit``
        receives each new piece of it as it comes. A prompt longer than ``max_len`` keeps
        its last half window (as a model trained on windows expects), with a warning.
        ``ids``: the prompt's tokens, when the caller has them already (the server counts
        them first). ``logprobs``: keep each new token's log-probability and this many
        alternatives' (``request.logprobs``; the model's own, before any decoding setting).
        ``constraint``: the grammar the output keeps to (:meth:`constraint`)."""
        tok = self.source_tokenizer
        ids = (tok.encode_prompt(prompt) if ids is None else list(ids)) or [tok.bos_id]
        max_len = self.config.model.max_len
        if len(ids) > max_len:
            warnings.warn(f"the prompt is {len(ids)} tokens, longer than the model's max_len "
                          f"({max_len}): it continues from the last {max(1, max_len // 2)}",
                          stacklevel=3)
        text = TextStream(tok, decode.stop)

        def on_token(request: Request, token: int) -> bool:
            if emit is None and not text.stop:  # nothing to show or to stop at: the text is
                text.ids.append(token)  # decoded once, when the request finishes
                return False
            piece = text.push(token)
            if emit is not None and piece:
                emit(piece)
            return text.stopped

        params = self.params(decode, seed=seed)
        if logprobs is not None:
            params = dataclasses.replace(params, logprobs=logprobs)
        request = Request(ids, params, on_token=on_token, adapter=self.adapter,
                          constraint=constraint)
        return Completion(request, text, emit)

    @torch.no_grad()
    def token_logprobs(self, ids: list[int], top: int = 0
                       ) -> list[tuple[float, list[tuple[int, float]]]]:
        """The log-probability of each token of ``ids`` after the first given the tokens
        before it, and the ``top`` most likely tokens' at each place: the model's own
        distribution (what :meth:`score` sums; no temperature or rule). At most ``max_len``
        tokens."""
        if len(ids) > self.config.model.max_len:
            raise ValueError(f"{len(ids)} tokens to score; the model reads at most "
                             f"{self.config.model.max_len} at once")
        if len(ids) < 2:
            return []
        x = as_batch(ids, self.device)
        with self.adapted():
            log_p = self.model(x, mask=torch.ones_like(x, dtype=torch.bool))[0, :-1].float()
        log_p = log_p.log_softmax(-1)  # (T - 1, V): position t predicts token t + 1
        chosen = log_p.gather(1, x[0, 1:, None])[:, 0].tolist()
        if not top:
            return [(lp, []) for lp in chosen]
        best = log_p.topk(top, dim=-1)
        return [(lp, list(zip(i, v, strict=True))) for lp, i, v in
                zip(chosen, best.indices.tolist(), best.values.tolist(), strict=True)]

    @torch.no_grad()
    def score(self, text, *, beam=None, outputs=None):
        """Loss (nats per token), perplexity, bits per token and per character over the whole
        text, read in consecutive windows of the model's ``max_len`` (the result says so:
        ``windows``). There are no outputs to keep."""
        tok, max_len = self.source_tokenizer, self.config.model.max_len
        ids = torch.tensor(tok.encode_prompt(text), dtype=torch.long)
        if ids.numel() < 2:
            raise DataError("the evaluation text is shorter than two tokens")
        nll = count = 0.0
        windows = 0
        for x, y in lm_eval_windows(ids, max_len):
            windows += 1
            x, y = x.to(self.device), y.to(self.device)
            with self.adapted():
                logits = self.model(x, mask=torch.ones_like(x, dtype=torch.bool))
            _, batch_nll, n = smoothed_cross_entropy(logits.flatten(0, 1), y.flatten())
            nll += float(batch_nll)
            count += int(n)
        chars = len(text) - len(tok.decode(ids[:1].tolist()))  # predicted characters
        loss = nll / count
        return {"tokens": int(count), "loss": loss, "perplexity": math.exp(min(loss, 50.0)),
                "bits_per_token": loss / math.log(2),
                "bits_per_char": nll / max(1, chars) / math.log(2),
                "windows": {"count": windows, "length": max_len,
                            "scored": "consecutive, non-overlapping windows over the whole "
                                      "text: every token after the first scored once, with "
                                      "the window's earlier tokens as its context"}}

    # --- looking inside ---------------------------------------------------------------------
    def _ids(self, text: str) -> list[int]:
        tok = self.source_tokenizer
        return tok.encode_prompt(text)[: self.config.model.max_len] or [tok.bos_id]

    @torch.no_grad()
    def attention(self, text, target=None):
        ids = self._ids(text)
        with self.adapted():
            _, weights = self.model.forward_with_attention(as_batch(ids, self.device))
        labels = token_labels(self.source_tokenizer, ids)
        return {"self-attention": attention_map(weights["decoder"][:, 0], labels, labels)}

    @torch.no_grad()
    def output_probabilities(self, text, target=None):
        """Each token's probability given the tokens before it (the first has none)."""
        ids = self._ids(text)
        with self.adapted():
            logits = self.model(as_batch(ids, self.device))
        labels = token_labels(self.source_tokenizer, ids)
        return [{"token": labels[0], "p": None}, *next_token_probabilities(logits, ids, labels)]


@dataclass
class Completion:
    """A language model's engine request and the text of its output."""

    request: Request
    text: TextStream
    emit: Callable[[str], None] | None = None

    def result(self) -> str:
        """The whole text, once the request has finished (the rest of it emitted)."""
        if self.request.error is not None:
            raise self.request.error
        rest = self.text.finish()
        if self.emit is not None and rest:
            self.emit(rest)
        return self.text.text


class TextStream:
    """Text of generated tokens as they come: only whole characters (a byte-level token may
    end inside one), cut before the first stop string, and holding back any text that could
    still turn into a stop string. ``push(id)`` returns the new text to show; ``finish()``
    the rest; ``text`` is the whole output; ``stopped`` says a stop string was met.

    A token's text is decoded from the few tokens since the text was last whole, not from
    the whole output: decoding it all for every token costs each token the output's length
    (a 32-row decode step makes 32 of them). The new text is that of ``ids[start:]``
    less that of ``ids[start:read]``: ``read`` is where the text was last whole, and
    ``start`` the read point before it, kept as context for tokenizers whose text of a token
    depends on the token before it (a SentencePiece word's leading space), as vLLM's
    detokenizer does. A stop string is looked for where a new one can be: ending in the new
    text. ``finish()`` decodes the whole output once, so that ``text`` ends as decoding it
    at once gives."""

    def __init__(self, tokenizer, stop: list[str] | tuple[str, ...] = ()) -> None:
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.longest = max((len(s) for s in self.stop), default=0)
        self.ids: list[int] = []
        self.start = self.read = 0  # ids[:read] are in text
        self.text = ""
        self.shown = 0  # characters of text shown
        self.stopped = False

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(token)
        decode, ids = self.tokenizer.decode, self.ids
        new = decode(ids[self.start:])[len(decode(ids[self.start:self.read])):]
        text = self.text + new
        since = max(0, len(self.text) - self.longest + 1)  # where a new stop string can start
        cuts = [i for s in self.stop if (i := text.find(s, since)) >= 0]
        if cuts:
            self.text, self.stopped = text[: min(cuts)], True
            return self._show(len(self.text))
        if new.endswith("\ufffd"):  # wait for the rest of the character
            return ""
        self.text, self.start, self.read = text, self.read, len(ids)
        hold = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])),
                   default=0)
        return self._show(len(text) - hold)

    def finish(self) -> str:
        if not self.stopped:  # the whole output decoded at once
            whole = self.tokenizer.decode(self.ids)
            if whole[: self.shown] != self.text[: self.shown]:  # shown text stays shown
                self.shown = len(whole)
            self.text = whole
        return self._show(len(self.text))

    def _show(self, end: int) -> str:
        """The text up to ``end`` not shown yet."""
        new = self.text[self.shown:end]
        self.shown = max(self.shown, end)
        return new


def vocabulary(tokenizer) -> tuple:
    """What makes two tokenizers' ids mean the same: every token and the special ids."""
    return (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id,
            [tokenizer.token(i) for i in range(tokenizer.vocab_size)])
