"""A fourth task, in one file: character tagging (sequence labelling) on the encoder
architecture. Each line of the data is ``text<TAB>tags`` with one tag character per text
character (here: V for a vowel, C for anything else); the model is an EncoderClassifier whose
head is applied to every position instead of a pooled one.

Nothing in vaswani lists this task: defining the class registers it (``name``), a config picks
it with ``[data] task = "tagging"``, and ``vaswani.load`` returns the :class:`Tagger` below for
its runs. Everything else (reading files, the tokenizer, encoding into memory maps, batching,
the training loop, checkpoints, resume) is vaswani's own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vaswani.data import files
from vaswani.data.batching import Batch, BucketBatches, pad
from vaswani.data.files import DataError
from vaswani.data.tokenizers import train_tokenizer
from vaswani.inference import Encoder
from vaswani.tasks import Task

IGNORE = -1  # the tag of <bos> and of padding: not predicted


class Tagging(Task):
    name = "tagging"
    arch = "encoder"
    labelled = True  # the tags are its classes
    metrics = ("valid_loss", "accuracy")
    FIELDS = {"ids": "ragged", "tags": "ragged"}

    # --- data ---------------------------------------------------------------------------
    def iter_examples(self, paths, report):
        for text, tags in files.iter_translation(paths, report):  # two TSV columns
            if len(text) != len(tags):
                raise DataError(f"{paths[0]}: {text!r} has {len(text)} characters but "
                                f"{len(tags)} tags")
            yield text, tags

    def train_tokenizers_from(self, inputs, kind):
        texts = (text for text, _ in inputs.train_examples())
        return train_tokenizer("char", texts, self.config.data.vocab_size), None

    def train_labels(self, inputs):
        return sorted({tag for _, tags in inputs.train_examples() for tag in tags})

    def encode_examples(self, examples, tokenizers, writer, ctx):
        """<bos> + one id per character; tag index + 1 per character (0 under <bos>)."""
        tok, index = tokenizers[0], {tag: i for i, tag in enumerate(ctx["labels"])}
        limit = self.config.model.max_len - 1
        ids, tags = [], []
        for text, text_tags in examples:
            ctx["truncated"] += len(text) > limit
            ids.append([tok.bos_id] + tok.encode(text)[:limit])
            tags.append([0] + [index[t] + 1 for t in text_tags[:limit]])
        writer.add_sequences("ids", ids)
        writer.add_sequences("tags", tags)

    # --- training -----------------------------------------------------------------------
    def model_fields(self, data):
        tok = data.source_tokenizer
        return {"vocab_size": tok.vocab_size, "pad_id": tok.pad_id,
                "n_classes": len(data.labels)}

    def batches(self, data, rank, world):
        return BucketBatches(data.train, data.valid, lengths=lambda split: split.lengths("ids"),
                             collate=self.collate, max_tokens=self.config.data.max_tokens,
                             seed=self.config.train.seed, rank=rank, world=world)

    def collate(self, examples):
        tags = pad([t.astype("int64") - 1 for _, t in examples], IGNORE)
        return Batch({"ids": pad([i for i, _ in examples], self.pad_id), "tags": tags},
                     targets=int((tags != IGNORE).sum()),
                     tokens=sum(len(i) for i, _ in examples))

    def loss(self, model, batch, smoothing):
        logits = tag_logits(model, batch["ids"])  # (B, S, C)
        flat, tags = logits.flatten(0, 1).float(), batch["tags"].flatten()
        nll = F.cross_entropy(flat, tags, ignore_index=IGNORE, reduction="sum")
        loss = F.cross_entropy(flat, tags, ignore_index=IGNORE, reduction="sum",
                               label_smoothing=smoothing)
        return loss, nll, (tags != IGNORE).sum()

    @torch.no_grad()
    def metric(self, model, data, batches, n_examples, device):
        right = total = 0
        for batch in batches.valid_batches():
            batch = batch.to(device)
            guess, tags = tag_logits(model, batch["ids"]).argmax(-1), batch["tags"]
            right += int(((guess == tags) & (tags != IGNORE)).sum())
            total += int((tags != IGNORE).sum())
        return {"accuracy": right / max(1, total)}


def tag_logits(model, ids):
    """The encoder's head on every position: (B, S) ids -> (B, S, C) tag logits."""
    return model.head(model.encode(ids))


class Tagger(Encoder):
    """Using a tagging run: the encoder family's methods, and tagging."""

    task_name = "tagging"
    describes = "a character tagger (encoder)"

    @torch.no_grad()
    def tag(self, texts: list[str]) -> list[str]:
        """One tag per character of each text."""
        tok = self.source_tokenizer
        out = []
        for text in texts:
            ids = torch.tensor([[tok.bos_id] + tok.encode(text)], device=self.device)
            guess = tag_logits(self.model, ids)[0, 1:].argmax(-1).tolist()
            out.append("".join(self.labels[g] for g in guess))
        return out

    def score(self, examples, *, beam=None, outputs=None):
        tagged = self.tag([text for text, _ in examples])
        if outputs is not None:
            outputs.extend(tagged)
        right = sum(a == b for (_, tags), got in zip(examples, tagged, strict=True)
                    for a, b in zip(tags, got, strict=True))
        return {"examples": len(examples),
                "accuracy": right / max(1, sum(len(tags) for _, tags in examples))}
