"""Language modelling: predict each next token of plain text, for the decoder-only model.

Data: any number of text files (globs allowed), read whole and joined by newlines, encoded as
one long sequence of token ids. Without validation files the last ``valid_fraction`` of the
text is held out (no window straddles the boundary). A training batch is ``batch_size``
windows of ``block_size + 1`` tokens from seeded random offsets; the model reads each window
but its last token and predicts each next one. The loss is averaged over every predicted
token (text has no padding).

Using a trained model: :meth:`generate` (greedy or sampled, streamed, with a KV cache),
:meth:`score` (loss, perplexity, bits per token and per character of a text),
:meth:`attention`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..config import DecodeConfig
from ..data import files
from ..data.batching import WindowBatches, lm_eval_windows
from ..data.encode import text_chunks
from ..data.files import DataError, ReadReport
from ..data.tokenizers import train_tokenizer
from ..generation import Rules, generate
from ..models.losses import smoothed_cross_entropy
from .base import Task, as_batch, attention_map, next_token_probabilities, token_labels


class LanguageModelling(Task):
    name = "lm"
    arch = "decoder"
    unit = "tokens"

    def check_training_config(self):
        super().check_training_config()
        m, d = self.config.model, self.config.data
        if d.block_size > m.max_len:
            raise ValueError(f"[data] block_size ({d.block_size}) must be at most [model] "
                             f"max_len ({m.max_len}): the model has no positions past it")

    # --- data ----------------------------------------------------------------------------
    FIELDS = {"tokens": "stream"}

    def iter_examples(self, paths, report):
        return files.iter_text_pieces(paths, report)  # pieces of the text, read in blocks

    def read(self, paths, report):
        return files.read_text(paths, report)

    def load(self, cache, tokenizers=None, labels=None, *, progress=True):
        data = super().load(cache, tokenizers, labels, progress=progress)
        if len(data.train) < 2:
            raise DataError("the language-model training text is shorter than two tokens")
        return data

    def train_tokenizers_from(self, inputs, kind):
        """On the training text (before the held-out tail), in chunks that tokenise as the
        whole text does; a text larger than ``tokenizer_sample`` gives a seeded sample of its
        chunks (whole lines, about 64 KB each) instead."""
        keep = inputs.sampler()
        pieces = self.iter_examples(inputs.files["train"], ReadReport(
            max_skip=self.config.data.max_skip))
        texts = (chunk for split, chunk in text_chunks(pieces, inputs.cut)
                 if split == "train" and keep())
        return train_tokenizer(kind, texts, self.config.data.vocab_size), None

    # --- training ------------------------------------------------------------------------
    def batches(self, data, rank, world):
        d = self.config.data
        return WindowBatches(data.train, data.valid, batch_size=d.batch_size,
                             block_size=d.block_size, seed=self.config.train.seed, rank=rank,
                             world=world)

    def loss(self, model, batch, smoothing):
        x = batch["input"]
        logits = model(x, mask=torch.ones_like(x, dtype=torch.bool))  # text has no padding
        return smoothed_cross_entropy(logits.flatten(0, 1), batch["target"].flatten(),
                                      smoothing=smoothing)

    def count(self, batch):
        return batch["target"].numel()

    def tokens(self, batch):
        return batch["input"].numel()

    # --- use -----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, run, prompt: str, decode: DecodeConfig, *, seed: int | None = None,
                 stream: Callable[[str], None] | None = None) -> str:
        """Continue ``prompt``; ``stream(text)`` receives the new text as it is produced. The
        text ends at ``<eos>``, ``max_new_tokens`` or the first of ``decode.stop``."""
        tok = run.source_tokenizer
        text = TextStream(tok, decode.stop)

        def on_token(i: int) -> bool:
            piece = text.push(i)
            if stream is not None and piece:
                stream(piece)
            return text.stopped

        generate(run.model, tok.encode(prompt), bos_id=tok.bos_id, eos_id=tok.eos_id,
                 max_new_tokens=decode.max_new_tokens, temperature=decode.temperature,
                 top_k=decode.top_k, top_p=decode.top_p, seed=seed, on_token=on_token,
                 rules=Rules.of(decode))
        rest = text.finish()
        if stream is not None and rest:
            stream(rest)
        return text.text

    @torch.no_grad()
    def score(self, run, text, *, beam=None, outputs=None):
        """Loss (nats per token), perplexity, bits per token and per character over the whole
        text, read in consecutive windows of the model's ``max_len`` (the result says so:
        ``windows``). There are no outputs to keep."""
        tok = run.source_tokenizer
        ids = torch.tensor(tok.encode(text), dtype=torch.long)
        if ids.numel() < 2:
            raise DataError("the evaluation text is shorter than two tokens")
        nll = count = 0.0
        windows = 0
        for x, y in lm_eval_windows(ids, self.config.model.max_len):
            windows += 1
            x, y = x.to(run.device), y.to(run.device)
            logits = run.model(x, mask=torch.ones_like(x, dtype=torch.bool))
            _, batch_nll, n = smoothed_cross_entropy(logits.flatten(0, 1), y.flatten())
            nll += float(batch_nll)
            count += int(n)
        chars = len(text) - len(tok.decode(ids[:1].tolist()))  # predicted characters
        loss = nll / count
        return {"tokens": int(count), "loss": loss, "perplexity": math.exp(min(loss, 50.0)),
                "bits_per_token": loss / math.log(2),
                "bits_per_char": nll / max(1, chars) / math.log(2),
                "windows": {"count": windows, "length": self.config.model.max_len,
                            "scored": "consecutive, non-overlapping windows over the whole "
                                      "text: every token after the first scored once, with "
                                      "the window's earlier tokens as its context"}}

    @torch.no_grad()
    def attention(self, run, text, target=None):
        tok = run.source_tokenizer
        ids = tok.encode(text)[: self.config.model.max_len] or [tok.bos_id]
        _, weights = run.model.forward_with_attention(as_batch(ids, run.device))
        labels = token_labels(tok, ids)
        return {"self-attention": attention_map(weights["decoder"][:, 0], labels, labels)}


    @torch.no_grad()
    def output_probabilities(self, run, text, target=None):
        """Each token's probability given the tokens before it (the first has none)."""
        tok = run.source_tokenizer
        ids = tok.encode(text)[: self.config.model.max_len] or [tok.bos_id]
        logits = run.model(as_batch(ids, run.device))
        labels = token_labels(tok, ids)
        return [{"token": labels[0], "p": None}, *next_token_probabilities(logits, ids, labels)]


class TextStream:
    """Text of generated tokens as they come: only whole characters (a byte-level token may
    end inside one), cut before the first stop string, and holding back any text that could
    still turn into a stop string. ``push(id)`` returns the new text to show; ``finish()``
    the rest; ``text`` is the whole output; ``stopped`` says a stop string was met."""

    def __init__(self, tokenizer, stop: list[str] | tuple[str, ...] = ()) -> None:
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.ids: list[int] = []
        self.shown = ""
        self.text = ""
        self.stopped = False

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        cuts = [text.find(s) for s in self.stop if s in text]
        if cuts:
            self.text, self.stopped = text[: min(cuts)], True
            return self._show(self.text)
        self.text = text
        if text.endswith("\ufffd"):  # wait for the rest of the character
            return ""
        hold = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])),
                   default=0)
        return self._show(text[: len(text) - hold])

    def finish(self) -> str:
        return self._show(self.text)

    def _show(self, text: str) -> str:
        new = text[len(self.shown):] if text.startswith(self.shown) else ""
        self.shown = text if text.startswith(self.shown) else self.shown
        return new
