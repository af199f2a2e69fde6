"""A task: what one family of model learns from, and how it is trained and used.

vaswani has three, one per architecture (``TASKS`` in ``tasks/__init__.py``):

    encoder-decoder -> Translation         tasks/translation.py
    decoder         -> LanguageModelling   tasks/language_model.py
    encoder         -> Classification      tasks/classification.py

Everything that differs between them lives in its task class, in the order a run meets it:

1. data: :meth:`Task.iter_examples` streams a split's files as examples (or, for text,
   pieces of it), :meth:`Task.train_tokenizers_from` trains the tokenizers on (a sample of) the
   training examples, :meth:`Task.encode_examples` writes their token ids (the token layout:
   which specials go where); data/encode.py holds out the validation set and keeps the
   encoded data in memory-mapped files, cached (:meth:`Task.load`, data/encode.py);
2. training: :meth:`Task.model_fields` (what the data decides in ``[model]``),
   :meth:`Task.batches` (global batch i -> this rank's share), :meth:`Task.loss`,
   :meth:`Task.count` (what the loss is normalised by), :meth:`Task.metric` (the validation
   metric named by ``[train] best_metric``);
3. use: :meth:`Task.evaluate` (``vaswani evaluate``), :meth:`Task.attention` (``vaswani
   attention``), and each task's own entry point (``translate``, ``generate``, ``classify``)
   that :class:`vaswani.Run` forwards to.

The training loop, the CLI and ``Run`` ask the task and never test which task it is. A fourth
task is one new file here and one line in ``TASKS``.

Special token ids (pad, bos, eos) come from the tokenizers, and ``[model] pad_id`` is set from
the source tokenizer when a run starts: nothing assumes that padding is id 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..config import RunConfig
from ..data import encode
from ..data.encode import TaskData
from ..data.files import ReadReport
from ..data.tokenizers import Tokenizer

Batch = dict[str, Tensor]


def encode_inputs(tokenizer: Tokenizer, texts: list[str], max_len: int, *, bos: bool = False,
                  eos: bool = False) -> list[list[int]]:
    """Token ids per text (with ``bos``/``eos`` if asked), cut to ``max_len`` with a warning
    that names the limit."""
    limit = max_len - int(bos) - int(eos)
    out, cut = [], []
    for i, ids in enumerate(tokenizer.encode_batch(texts)):
        if len(ids) > limit:
            cut.append((i, len(ids)))
            ids = ids[:limit]
        out.append(([tokenizer.bos_id] if bos else []) + ids + ([tokenizer.eos_id] if eos else []))
    if cut:
        i, n = max(cut, key=lambda c: c[1])
        warnings.warn(f"{len(cut)} of {len(texts)} input(s) were longer than the model's "
                      f"max_len ({max_len} tokens) and were truncated (the longest, input "
                      f"{i + 1}, had {n})", stacklevel=3)
    return out


def as_batch(ids: list[int], device: torch.device) -> Tensor:
    """One sequence of ids as a (1, T) batch."""
    return torch.tensor([ids], dtype=torch.long, device=device)


def token_labels(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """A readable label per token id (for attention plots)."""
    return [tokenizer.token(i) for i in ids]


def next_token_probabilities(logits: Tensor, ids: list[int], labels: list[str],
                             last: tuple[int, str] | None = None) -> list[dict]:
    """For each position t of a teacher-forced (1, T, V) ``logits``, the probability it gave
    the next token ``ids[t + 1]`` (``last``: (id, label) of what follows the final position),
    labelled with that token."""
    probs = logits[0].float().softmax(-1)
    out = []
    follow = list(zip(ids[1:], labels[1:], strict=True)) + ([last] if last else [])
    for t, (i, label) in enumerate(follow):
        out.append({"token": label, "p": round(float(probs[t, i]), 5)})
    return out


def attention_map(weights: Tensor, queries: list[str], keys: list[str]) -> dict:
    """One kind of attention of one input: (L, H, Tq, Tk) weights and the token labels."""
    return {"weights": weights.float().cpu(), "queries": queries, "keys": keys}


class Task:
    """The interface every task implements; the docstring of this module says what each
    method is for. Built with the run's config (after ``vaswani train`` has filled in what
    the data decides: vocabulary sizes and ``pad_id``)."""

    name: ClassVar[str]  # "translation", "lm", "classification": what a registry dataset is for
    arch: ClassVar[str]  # the model architecture that serves it
    metrics: ClassVar[tuple[str, ...]] = ("valid_loss",)  # what [train] best_metric may name
    unit: ClassVar[str] = "examples"  # what len(TaskData.train) counts

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    @property
    def pad_id(self) -> int:
        return self.config.model.pad_id

    def check_training_config(self) -> None:
        """What training this task needs of the config, checked before a run directory is
        touched (a ValueError naming the fields)."""
        best = self.config.train.best_metric
        if best not in self.metrics:
            raise ValueError(f"best_metric ({best!r}) must be one of {list(self.metrics)} "
                             "for this task")

    # --- 1. data -------------------------------------------------------------------------
    FIELDS: ClassVar[dict[str, str]] = {}  # encoded fields: "ragged", "labels" or "stream"

    def load(self, cache: Path, tokenizers: tuple[Tokenizer, Tokenizer | None] | None = None,
             labels: list[str] | None = None, *, progress: bool = True) -> TaskData:
        """The run's data: the ``[data]`` files read, a validation set held out, the
        tokenizers trained (unless given, as when resuming), everything encoded into memory
        maps, once: later calls with the same inputs map the same files (data/encode.py)."""
        return encode.load(self, cache, tokenizers, labels, progress=progress)

    def iter_examples(self, paths: list[str], report: ReadReport) -> Iterator:
        """The examples (for text: the lines) of ``paths``, in a stream; bad lines are
        reported with file:line."""
        raise NotImplementedError

    def read(self, paths: list[str], report: ReadReport):
        """The examples of ``paths`` in memory (what ``vaswani evaluate`` scores)."""
        return list(self.iter_examples(paths, report))

    def example_bytes(self, example) -> int:
        """About how many input bytes an example took (for the progress bar)."""
        return sum(len(x) for x in example if isinstance(x, str)) + 2

    def encoding_options(self) -> dict:
        """What, beside the files and the tokenizer, decides the encoded data."""
        d = self.config.data
        return {"max_len": self.config.model.max_len, "valid_fraction": d.valid_fraction,
                "split_seed": d.split_seed, "max_skip": d.max_skip, "format": d.format}

    def train_tokenizers_from(self, inputs, kind: str) -> tuple[Tokenizer, Tokenizer | None]:
        """(source, target) tokenizers trained on (a sample of) the training data;
        ``inputs`` is a :class:`~vaswani.data.encode.Inputs`. Target is None for one-sided
        tasks."""
        raise NotImplementedError

    def train_labels(self, inputs) -> list[str]:
        """The class labels the training examples name (tasks without labels: none)."""
        return []

    def encode_examples(self, examples: list, tokenizers, writer, ctx: dict) -> None:
        """Write a batch of examples' token ids (the token layout) to an encoded ``writer``;
        ``ctx["truncated"]`` counts sequences cut to max_len."""
        raise NotImplementedError

    def train_examples(self, inputs) -> Iterator:
        """The training examples (not held out), sampled for the tokenizer as
        ``[data] tokenizer_sample`` says."""
        mask, keep = inputs.held_out, inputs.sampler()
        report = ReadReport(max_skip=self.config.data.max_skip)
        for i, example in enumerate(self.iter_examples(inputs.files["train"], report)):
            if (mask is None or not mask[i]) and keep():
                yield example

    # --- 2. training ---------------------------------------------------------------------
    def model_fields(self, data: TaskData) -> dict:
        """``[model]`` values the data decides."""
        return {"vocab_size": data.source_tokenizer.vocab_size,
                "pad_id": data.source_tokenizer.pad_id}

    def batches(self, data: TaskData, rank: int, world: int):
        """An object with ``micro_batch(i) -> Batch`` (this rank's share of global batch i, a
        pure function of i and the seed) and ``valid_batches() -> Iterator[Batch]``."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Batch, smoothing: float
             ) -> tuple[Tensor, Tensor, Tensor]:
        """(smoothed loss sum, NLL sum, number of targets) of one batch."""
        raise NotImplementedError

    def count(self, batch: Batch) -> int:
        """The targets a batch's loss is averaged over."""
        raise NotImplementedError

    def tokens(self, batch: Batch) -> int:
        """Input tokens (non-padding) a batch feeds the model, for throughput."""
        raise NotImplementedError

    @torch.no_grad()
    def metric(self, model: nn.Module, data: TaskData, batches, n_examples: int,
               device: torch.device) -> dict:
        """The task's validation metrics on up to ``n_examples`` examples (``batches``: what
        :meth:`batches` returned for this run)."""
        return {}

    # --- 3. use --------------------------------------------------------------------------
    def evaluate(self, run, paths: list[str], *, beam: int | None = None,
                 outputs: list[str] | None = None) -> dict:
        """``vaswani evaluate``: the task's scores on the examples in ``paths``; ``outputs``
        (a list) receives the model's output for each example where the task has one."""
        report = ReadReport(max_skip=self.config.data.max_skip)
        result = {"task": self.name, **self.score(run, self.read(paths, report), beam=beam,
                                                  outputs=outputs)}
        if report.summary():
            result["data_notes"] = report.summary()
        return result

    def score(self, run, examples: list, *, beam: int | None = None,
              outputs: list[str] | None = None) -> dict:
        raise NotImplementedError

    def attention(self, run, text: str, target: str | None = None) -> dict[str, dict]:
        """``vaswani attention``: {kind: attention_map(...)} for one input."""
        raise NotImplementedError

    def output_probabilities(self, run, text: str, target: str | None = None) -> list[dict]:
        """What the model predicts for one input, for the attention explorer: each output
        token (or class) with its probability, ``[{"token": str, "p": float | None}]``."""
        raise NotImplementedError

