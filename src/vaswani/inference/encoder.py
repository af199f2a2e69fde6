"""Using an encoder run: classify texts (a run trained on labels), embed them (any encoder,
such as an imported BERT without a head), score a labelled file (accuracy, macro-F1, the
confusion matrix), and look at its attention.

Texts are encoded as the model trained on them (tasks/classification.py: ``<bos> + tokens``,
or a pretrained tokenizer's own specials) and cut to ``max_len`` with one warning.
"""

from __future__ import annotations

import warnings

import torch

from ..data.batching import pad
from ..data.files import DataError
from ..tasks.classification import classifier_inputs
from .base import Run, check_batch_size
from .inside import as_batch, attention_map, token_labels


class Encoder(Run):
    @property
    def action(self) -> str:
        return self.family.action if self.labels else "embed"

    @property
    def summary(self) -> str:
        return self.family.summary if self.labels else "sentence encoder: compares two texts"

    def input_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids, _ in classifier_inputs(self.source_tokenizer, texts, 2**62)]

    def inputs(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids, cut to max_len with one warning that counts the cuts."""
        limit = self.config.model.max_len
        pairs = classifier_inputs(self.source_tokenizer, texts, limit)
        cut = sum(c for _, c in pairs)
        if cut:
            warnings.warn(f"{cut} of {len(texts)} input(s) were longer than the model's max_len "
                          f"({limit} tokens) and were truncated", stacklevel=3)
        return [ids for ids, _ in pairs]

    @torch.no_grad()
    def _softmax(self, texts: list[str], batch_size: int):
        """The classes' probabilities, one (batch, classes) tensor per batch of texts."""
        if not self.labels:
            raise WrongHead(f"{self.run_dir} holds an encoder without a classification head "
                            "(n_classes = 0): embed with it, or fine-tune it on labelled data")
        check_batch_size(batch_size)
        encoded = self.inputs(texts)
        for start in range(0, len(texts), batch_size):
            ids = pad(encoded[start:start + batch_size], self.config.model.pad_id)
            yield self.model(ids.to(self.device)).float().softmax(-1)

    def classify(self, texts: list[str], batch_size: int = 64) -> list[tuple[str, float]]:
        """(label, probability) of the most likely class for each text."""
        out = []
        for probs in self._softmax(texts, batch_size):
            p, k = probs.max(-1)
            out.extend((self.labels[int(i)], float(q)) for i, q in zip(k, p, strict=True))
        return out

    def probabilities(self, texts: list[str], batch_size: int = 64) -> list[dict[str, float]]:
        """Every class's probability, for each text."""
        return [{label: round(p, 6) for label, p in zip(self.labels, row, strict=True)}
                for probs in self._softmax(texts, batch_size) for row in probs.tolist()]

    @torch.no_grad()
    def embed(self, texts: list[str], batch_size: int = 32) -> torch.Tensor:
        """Sentence embeddings (N, D): the encoder's hidden states averaged over each text's
        tokens (padding excluded) and L2-normalised. Texts are batched by length."""
        check_batch_size(batch_size)
        encoded = self.inputs(texts)
        out = torch.zeros(len(texts), self.config.model.d_model)
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            ids = pad([encoded[i] for i in chunk], self.config.model.pad_id).to(self.device)
            lengths = torch.tensor([len(encoded[i]) for i in chunk], device=self.device)
            mask = torch.arange(ids.size(1), device=self.device) < lengths[:, None]
            hidden = self.model.encode(ids, mask=mask)
            out[chunk] = self.model.sentence_embeddings(hidden, mask).float().cpu()
        return out

    def score(self, examples, *, beam=None, outputs=None):
        """Accuracy, macro-F1 and the confusion matrix (rows: true label, columns: predicted
        label, in the order of ``labels``)."""
        labels = self.labels
        index = {label: i for i, label in enumerate(labels)}
        unknown = sorted({label for label, _ in examples if label not in index})
        if unknown:
            raise DataError(f"labels {unknown} are not among the model's labels {labels}")
        predicted = [label for label, _ in self.classify([t for _, t in examples])]
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

    # --- looking inside ---------------------------------------------------------------------
    @torch.no_grad()
    def attention(self, text, target=None):
        ids = self.inputs([text])[0]
        _, weights = self.model.encode_with_attention(as_batch(ids, self.device))
        labels = token_labels(self.source_tokenizer, ids)
        return {"self-attention": attention_map(weights["encoder"][:, 0], labels, labels)}

    def output_probabilities(self, text, target=None):
        """The classes' probabilities (none for an encoder without a head)."""
        if not self.labels:
            return []
        probs = self.probabilities([text])[0]
        return [{"token": label, "p": p} for label, p in sorted(probs.items(),
                                                               key=lambda kv: -kv[1])]


class WrongHead(ValueError):
    """Classification asked of an encoder that has no classification head."""
