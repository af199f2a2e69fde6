"""Classification: a label for each text, for the encoder (and sentence embeddings from an
encoder without a classification head, such as an imported BERT).

Data: TSV (``label<TAB>text``), CSV or JSONL with ``label`` and ``text`` (see data/files.py).
The labels are the sorted distinct training labels. Token layout: ``<bos> + tokens`` (the
``<bos>`` doubles as the [CLS] position for ``pooling = "cls"``); a pretrained tokenizer adds
its own specials instead (BERT: ``[CLS] tokens [SEP]``). The loss is averaged over examples;
the validation metric is accuracy.

Using a trained model: :meth:`classify`, :meth:`embed`, :meth:`score` (accuracy, macro-F1,
confusion matrix), :meth:`attention`.
"""

from __future__ import annotations

import warnings

import torch

from ..data import files
from ..data.batching import BucketBatches, pad
from ..data.files import DataError, ReadReport
from ..data.tokenizers import Tokenizer, train_tokenizer
from ..models.losses import smoothed_cross_entropy
from .base import Batch, Task, as_batch, attention_map, token_labels


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

    # --- data ----------------------------------------------------------------------------
    FIELDS = {"ids": "ragged", "label": "labels"}

    def iter_examples(self, paths, report):
        return files.iter_classification(paths, self.config.data.format, report)

    def train_tokenizers_from(self, inputs, kind):
        texts = (text for _, text in self.train_examples(inputs))
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
        return {"ids": pad([ids for ids, _ in examples], self.pad_id),
                "label": torch.tensor([int(label) for _, label in examples])}

    def loss(self, model, batch, smoothing):
        return smoothed_cross_entropy(model(batch["ids"]), batch["label"], smoothing=smoothing)

    def count(self, batch):
        return batch["label"].numel()

    def tokens(self, batch):
        return int((batch["ids"] != self.pad_id).sum())

    @torch.no_grad()
    def metric(self, model, data, batches, n_examples, device):
        correct = total = 0
        for batch in batches.valid_batches():  # all of them, whatever n_examples says
            ids, label = batch["ids"].to(device), batch["label"].to(device)
            correct += int((model(ids).argmax(-1) == label).sum())
            total += label.numel()
        return {"accuracy": correct / max(1, total)}

    # --- use -----------------------------------------------------------------------------
    def inputs(self, run, texts: list[str]) -> list[list[int]]:
        """Each text's ids, cut to max_len with one warning that counts the cuts."""
        limit = self.config.model.max_len
        pairs = classifier_inputs(run.source_tokenizer, texts, limit)
        cut = sum(c for _, c in pairs)
        if cut:
            warnings.warn(f"{cut} of {len(texts)} input(s) were longer than the model's max_len "
                          f"({limit} tokens) and were truncated", stacklevel=3)
        return [ids for ids, _ in pairs]

    @torch.no_grad()
    def _softmax(self, run, texts: list[str], batch_size: int):
        """The classes' probabilities, one (batch, classes) tensor per batch of texts."""
        encoded = self.inputs(run, texts)
        for start in range(0, len(texts), batch_size):
            ids = pad(encoded[start:start + batch_size], self.pad_id).to(run.device)
            yield run.model(ids).float().softmax(-1)

    def classify(self, run, texts: list[str], *, batch_size: int = 64
                 ) -> list[tuple[str, float]]:
        """(label, probability) of the most likely class for each text."""
        out = []
        for probs in self._softmax(run, texts, batch_size):
            p, k = probs.max(-1)
            out.extend((run.labels[int(i)], float(q)) for i, q in zip(k, p, strict=True))
        return out

    def probabilities(self, run, texts: list[str], *, batch_size: int = 64
                      ) -> list[dict[str, float]]:
        """Every class's probability, for each text."""
        return [{label: round(p, 6) for label, p in zip(run.labels, row, strict=True)}
                for probs in self._softmax(run, texts, batch_size) for row in probs.tolist()]

    def output_probabilities(self, run, text, target=None):
        """The classes' probabilities (none for an encoder without a head)."""
        if not run.labels:
            return []
        probs = self.probabilities(run, [text])[0]
        return [{"token": label, "p": p} for label, p in sorted(probs.items(),
                                                               key=lambda kv: -kv[1])]

    @torch.no_grad()
    def embed(self, run, texts: list[str], *, batch_size: int = 32) -> torch.Tensor:
        """Sentence embeddings (N, D): the encoder's hidden states averaged over each text's
        tokens (padding excluded) and L2-normalised. Texts are batched by length."""
        encoded = self.inputs(run, texts)
        out = torch.zeros(len(texts), self.config.model.d_model)
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            ids = pad([encoded[i] for i in chunk], self.pad_id).to(run.device)
            lengths = torch.tensor([len(encoded[i]) for i in chunk], device=run.device)
            mask = torch.arange(ids.size(1), device=run.device) < lengths[:, None]
            hidden = run.model.encode(ids, mask=mask)
            out[chunk] = run.model.sentence_embeddings(hidden, mask).float().cpu()
        return out

    def score(self, run, examples, *, beam=None, outputs=None):
        """Accuracy, macro-F1 and the confusion matrix (rows: true label, columns: predicted
        label, in the order of ``labels``)."""
        labels = run.labels
        index = {label: i for i, label in enumerate(labels)}
        unknown = sorted({label for label, _ in examples if label not in index})
        if unknown:
            raise DataError(f"labels {unknown} are not among the model's labels {labels}")
        predicted = [label for label, _ in self.classify(run, [t for _, t in examples])]
        if outputs is not None:
            outputs.extend(predicted)
        confusion = [[0] * len(labels) for _ in labels]
        for (truth, _), guess in zip(examples, predicted, strict=True):
            confusion[index[truth]][index[guess]] += 1
        f1s = []
        for k in range(len(labels)):
            tp = confusion[k][k]
            fp = sum(confusion[r][k] for r in range(len(labels))) - tp
            fn = sum(confusion[k]) - tp
            f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
        correct = sum(confusion[k][k] for k in range(len(labels)))
        return {"examples": len(examples), "accuracy": correct / max(1, len(examples)),
                "macro_f1": sum(f1s) / len(f1s), "labels": labels, "confusion": confusion}

    @torch.no_grad()
    def attention(self, run, text, target=None):
        ids = self.inputs(run, [text])[0]
        _, weights = run.model.encode_with_attention(as_batch(ids, run.device))
        labels = token_labels(run.source_tokenizer, ids)
        return {"self-attention": attention_map(weights["encoder"][:, 0], labels, labels)}
