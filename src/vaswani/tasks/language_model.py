"""Language modelling: predict each next token of plain text, for the decoder-only model.

Data: any number of text files (globs allowed), read whole and joined by newlines, encoded as
one long sequence of token ids. Without validation files the last ``valid_fraction`` of the
text is held out (no window straddles the boundary). A training batch is ``batch_size``
windows of ``block_size + 1`` tokens from seeded random offsets; the model reads each window
but its last token and predicts each next one. The loss is averaged over every predicted
token (text has no padding).

A trained language model is used through inference/language_model.py.
"""

from __future__ import annotations

from ..data import files
from ..data.batching import WindowBatches
from ..data.encode import text_chunks
from ..data.files import DataError, ReadReport
from ..data.tokenizers import train_tokenizer
from .base import Task


class LanguageModelling(Task):
    name = "lm"
    arch = "decoder"
    unit = "tokens"

    def micro_batch_tokens(self) -> int:
        return self.config.data.batch_size * self.config.data.block_size

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
        # text has no padding: causal attention alone
        return self.next_token_loss(model, batch["input"], batch["target"], smoothing=smoothing)
