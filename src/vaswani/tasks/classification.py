"""Classification: a label for each text, for the encoder (and sentence embeddings from an
encoder without a classification head, such as an imported BERT).

Data: TSV (``label<TAB>text``), CSV or JSONL with ``label`` and ``text`` (see data/files.py).
The labels are the sorted distinct training labels. Token layout: ``<bos> + tokens`` (the
``<bos>`` doubles as the [CLS] position for ``pooling = "cls"``); a pretrained tokenizer adds
its own specials instead (BERT: ``[CLS] tokens [SEP]``). The loss is averaged over examples;
the validation metric is accuracy.

A trained encoder is used through inference/encoder.py.
"""

from __future__ import annotations

import torch

from ..data import files
from ..data.batching import Batch, BucketBatches, pad
from ..data.files import DataError, ReadReport
from ..data.tokenizers import Tokenizer, train_tokenizer
from .base import Task


def classifier_inputs(tok: Tokenizer, texts: list[str], max_len: int
                      ) -> list[tuple[list[int], bool]]:
    """(ids, truncated) of each text for an encoder, encoded as one batch: <bos> text; a
    pretrained tokenizer adds its own specials instead (BERT: [CLS] text [SEP], cut so that
    [SEP] stays)."""
    if hasattr(tok, "encode_with_specials"):
        return [(ids, False) if len(ids) <= max_len else (ids[: max_len - 1] + ids[-1:], True)
                for ids in tok.encode_with_specials(texts)]
    return [(([tok.bos_id] + ids.tolist())[:max_len], len(ids) + 1 > max_len)
            for ids in tok.encode_arrays(texts)]


class Classification(Task):
    name = "classification"
    arch = "encoder"
    metrics = ("valid_loss", "accuracy")
    labelled = True

    # --- data ----------------------------------------------------------------------------
    FIELDS = {"ids": "ragged", "label": "labels"}

    def iter_examples(self, paths, report):
        return files.iter_classification(paths, self.config.data.format, report)

    def train_tokenizers_from(self, inputs, kind):
        texts = (text for _, text in inputs.train_examples())
        return train_tokenizer(kind, texts, self.config.data.vocab_size), None

    def train_labels(self, inputs) -> list[str]:
        """The sorted labels of the training examples (held-out ones excluded)."""
        mask, seen = inputs.held_out, set()
        report = ReadReport(max_skip=self.config.data.max_skip)
        for i, (label, _) in enumerate(self.iter_examples(inputs.files["train"], report)):
            if mask is None or not mask[i]:
                seen.add(label)
        return sorted(seen)

    def encode_examples(self, examples, tokenizers, writer, ctx):
        """<bos> + ids (a pretrained tokenizer's own specials instead), cut to max_len; the
        label's index among the training labels."""
        index = {label: i for i, label in enumerate(ctx["labels"])}
        unknown = sorted({label for label, _ in examples if label not in index})
        if unknown:
            raise DataError(f"validation labels {unknown} never occur in the training data")
        encoded = classifier_inputs(tokenizers[0], [text for _, text in examples],
                                    self.config.model.max_len)
        ctx["truncated"] += sum(cut for _, cut in encoded)
        writer.add_sequences("ids", [ids for ids, _ in encoded])
        writer.add_labels([index[label] for label, _ in examples])

    # --- training ------------------------------------------------------------------------
    def model_fields(self, data):
        return {**super().model_fields(data), "n_classes": len(data.labels)}

    def batches(self, data, rank, world):
        return BucketBatches(data.train, data.valid,
                             lengths=lambda split: split.lengths("ids"),
                             collate=self.collate, max_tokens=self.config.data.max_tokens,
                             seed=self.config.train.seed, rank=rank, world=world)

    def collate(self, examples: list) -> Batch:
        return Batch({"ids": pad([ids for ids, _ in examples], self.pad_id,
                                 multiple=self.config.data.pad_to_multiple,
                                 cap=self.config.model.max_len),
                      "label": torch.tensor([int(label) for _, label in examples])},
                     targets=len(examples), tokens=sum(len(ids) for ids, _ in examples))

    def loss(self, model, batch, smoothing):
        return self.criterion(model(batch["ids"]), batch["label"], smoothing=smoothing)

    @torch.no_grad()
    def metric(self, model, data, batches, n_examples, device):
        correct = total = 0
        for batch in batches.valid_batches():  # all of them, whatever n_examples says
            ids, label = batch["ids"].to(device), batch["label"].to(device)
            correct += int((model(ids).argmax(-1) == label).sum())
            total += label.numel()
        return {"accuracy": correct / max(1, total)}
