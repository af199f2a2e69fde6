"""A task: what one family of model learns from, and how it is trained and used.

vaswani has three, one per architecture (``TASKS`` in ``tasks/__init__.py``):

    encoder-decoder -> Translation         tasks/translation.py
    decoder         -> LanguageModelling   tasks/language_model.py
    encoder         -> Classification      tasks/classification.py

Everything that differs between them lives in its task class, in the order a run meets it:

1. data: :meth:`Task.read` a split's files into examples, :meth:`Task.hold_out` a validation
   set when there are no validation files, :meth:`Task.train_tokenizers`, and
   :meth:`Task.encode` the examples into token ids (the token layout: which specials go where);
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

import hashlib
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..config import DataConfig, RunConfig
from ..data import prepare
from ..data.files import DataError, ReadReport
from ..data.tokenizers import Tokenizer, train_tokenizer

Batch = dict[str, Tensor]


@dataclass
class TaskData:
    """A run's training and validation examples as token ids, with their tokenizers.

    ``train``/``valid`` hold what the task's :meth:`Task.encode` made (lists of examples, or one
    tensor of token ids for language modelling); ``raw_valid`` the validation examples as read
    (for metrics that compare text)."""

    train: list | Tensor
    valid: list | Tensor
    source_tokenizer: Tokenizer
    target_tokenizer: Tokenizer | None = None
    labels: list[str] = field(default_factory=list)
    raw_valid: list = field(default_factory=list)
    report: ReadReport = field(default_factory=ReadReport)
    truncated: int = 0

    def fingerprint(self) -> str:
        """A hash of the training token ids: resuming on different data is caught."""
        h = hashlib.sha256()
        if isinstance(self.train, Tensor):
            h.update(self.train.numpy().tobytes())
        else:
            for a, b in self.train:
                h.update(repr((a, b)).encode())
        return h.hexdigest()[:16]

    def clip(self, ids: list[int], limit: int) -> list[int]:
        """``ids`` cut to ``limit`` tokens; cuts are counted and reported."""
        if len(ids) > limit:
            self.truncated += 1
            return ids[:limit]
        return ids


def split_files(cfg: DataConfig, split: str, cache: Path) -> list[str]:
    """The files of a split: ``[data] train/valid/test``, or those of a registry dataset
    (prepared on first use) when ``dataset`` names one."""
    if cfg.dataset:
        files = prepare.prepared_files(cfg.dataset, cache)
        return [str(files[split])] if split in files else []
    return list(getattr(cfg, split))


def hold_out(examples: list, fraction: float, seed: int) -> tuple[list, list]:
    """A deterministic (train, valid) split: shuffle by seed, hold out ``fraction``."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_valid = max(1, round(len(examples) * fraction)) if fraction > 0 else 0
    if n_valid >= len(examples):
        raise DataError(f"only {len(examples)} examples: too few to hold out a validation set")
    held = set(order[:n_valid])
    return ([e for i, e in enumerate(examples) if i not in held],
            [e for i, e in enumerate(examples) if i in held])


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
    def load(self, cache: Path, tokenizers: tuple[Tokenizer, Tokenizer | None] | None = None,
             labels: list[str] | None = None) -> TaskData:
        """Read the ``[data]`` files, hold out validation examples, train the tokenizers
        (unless given, as when resuming) and encode everything."""
        d = self.config.data
        report = ReadReport(max_skip=d.max_skip)
        kind = d.tokenizer
        if d.dataset:
            spec = prepare.lookup(d.dataset)
            if spec.task != self.name:
                raise ValueError(f"dataset {d.dataset!r} is for {spec.task}, but the model "
                                 f"does {self.name}")
            kind = spec.tokenizer or kind
        train_files = split_files(d, "train", cache)
        if not train_files:
            raise ValueError("[data] needs train files (or a dataset name)")
        train = self.read(train_files, report)
        valid_files = split_files(d, "valid", cache)
        if valid_files:
            valid = self.read(valid_files, report)
        else:
            train, valid = self.hold_out(train)
        if not train:
            raise DataError(f"no training examples in {', '.join(train_files)}")
        source, target = tokenizers or self.train_tokenizers(train, kind)
        data = TaskData([], [], source, target, list(labels or []), valid, report)
        self.encode(data, train, valid)
        return data

    def read(self, paths: list[str], report: ReadReport) -> list:
        """The examples in ``paths`` (bad lines are reported with file:line)."""
        raise NotImplementedError

    def hold_out(self, examples: list) -> tuple[list, list]:
        """(train, valid) when the config names no validation files."""
        d = self.config.data
        return hold_out(examples, d.valid_fraction, d.split_seed)

    def train_tokenizers(self, examples: list, kind: str) -> tuple[Tokenizer, Tokenizer | None]:
        """(source, target) tokenizers trained on the training examples; target is None for
        one-sided tasks."""
        return train_tokenizer(kind, self.texts(examples), self.config.data.vocab_size), None

    def texts(self, examples: list) -> list[str]:
        """The text of each example (what a one-sided task's tokenizer is trained on)."""
        raise NotImplementedError

    def encode(self, data: TaskData, train: list, valid: list) -> None:
        """Fill ``data.train`` and ``data.valid`` with the examples' token ids."""
        raise NotImplementedError

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
    def evaluate(self, run, paths: list[str], *, beam: int | None = None) -> dict:
        """``vaswani evaluate``: the task's scores on the examples in ``paths``."""
        report = ReadReport(max_skip=self.config.data.max_skip)
        result = {"task": self.name, **self.score(run, self.read(paths, report), beam=beam)}
        if report.summary():
            result["data_notes"] = report.summary()
        return result

    def score(self, run, examples: list, *, beam: int | None = None) -> dict:
        raise NotImplementedError

    def attention(self, run, text: str, target: str | None = None) -> dict[str, dict]:
        """``vaswani attention``: {kind: attention_map(...)} for one input."""
        raise NotImplementedError

