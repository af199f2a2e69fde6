"""From a ``[data]`` config to tokenised training and validation examples.

The model architecture decides the task: ``encoder-decoder`` -> translation pairs,
``decoder`` -> language modelling, ``encoder`` -> classification. ``dataset = "copy"`` is the
built-in synthetic copy task (random strings of a-j, length 5-20; the target is the source).

Token layout: a source is ``tokens + <eos>``; a target is ``<bos> + tokens + <eos>`` (the model
reads ``tgt[:-1]`` and predicts ``tgt[1:]``); a classifier input is ``<bos> + tokens`` (the
``<bos>`` doubles as the [CLS] position for ``pooling = "cls"``). Over-long examples are
truncated to the model's ``max_len`` and counted.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..config import DataConfig
from . import files, prepare
from .files import DataError, ReadReport
from .tokenizers import BOS_ID, EOS_ID, Tokenizer, train_tokenizer

COPY_LETTERS = "abcdefghij"


def copy_task_pairs(n: int, seed: int, min_len: int = 5, max_len: int = 20) -> list[tuple]:
    rng = random.Random(seed)
    strings = ["".join(rng.choice(COPY_LETTERS) for _ in range(rng.randint(min_len, max_len)))
               for _ in range(n)]
    return [(s, s) for s in strings]


@dataclass
class Dataset:
    """Tokenised examples for one task. ``train``/``valid`` hold, per task:
    translation: list of (src ids, tgt ids); classification: list of (ids, label index);
    language modelling: one 1-D tensor of token ids."""

    task: str
    train: list | Tensor
    valid: list | Tensor
    source_tokenizer: Tokenizer
    target_tokenizer: Tokenizer | None = None
    labels: list[str] = field(default_factory=list)
    raw_valid: list = field(default_factory=list)  # untokenised (for task metrics)
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


TASKS = {"encoder-decoder": "translation", "decoder": "lm", "encoder": "classification"}


def split(examples: list, fraction: float, seed: int) -> tuple[list, list]:
    """A deterministic (train, valid) split: shuffle by seed, hold out ``fraction``."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_valid = max(1, round(len(examples) * fraction)) if fraction > 0 else 0
    if n_valid >= len(examples):
        raise DataError(f"only {len(examples)} examples: too few to hold out a validation set")
    held = set(order[:n_valid])
    return ([e for i, e in enumerate(examples) if i not in held],
            [e for i, e in enumerate(examples) if i in held])


def read_examples(cfg: DataConfig, task: str, paths: list[str], report: ReadReport):
    if task == "translation":
        return files.read_translation(paths, report)
    if task == "classification":
        return files.read_classification(paths, cfg.format, report)
    return files.read_text(paths, report)


def split_files(cfg: DataConfig, split: str, cache: Path | None) -> list[str]:
    """The files of a split: ``[data] train/valid/test``, or those of a prepared dataset
    (prepared on first use) when ``dataset`` names one."""
    if cfg.dataset and cfg.dataset != "copy":
        spec = prepare.lookup(cfg.dataset)
        if cache is None:
            raise ValueError(f"dataset {cfg.dataset!r} needs a cache directory")
        return [str(prepare.prepared_files(spec.name, cache)[split])]
    return list(getattr(cfg, split))


def load_raw(cfg: DataConfig, task: str, cache: Path | None = None):
    """(train, valid, report): untokenised examples (texts for LM)."""
    report = ReadReport(max_skip=cfg.max_skip)
    if cfg.dataset == "copy":
        if task != "translation":
            raise ValueError("dataset 'copy' needs model arch 'encoder-decoder'")
        return copy_task_pairs(20_000, cfg.split_seed), \
            copy_task_pairs(500, cfg.split_seed + 1), report
    if cfg.dataset:
        spec = prepare.lookup(cfg.dataset)
        if spec.task != task:
            raise ValueError(f"dataset {cfg.dataset!r} is for {spec.task}, but the model "
                             f"does {task}")
    train_files = split_files(cfg, "train", cache)
    if not train_files:
        raise ValueError("[data] needs train files (or a dataset name)")
    train = read_examples(cfg, task, train_files, report)
    valid_files = split_files(cfg, "valid", cache)
    if valid_files:
        valid = read_examples(cfg, task, valid_files, report)
    elif task == "lm":  # hold out the end of the text: no window straddles the boundary
        cut = int(len(train) * (1 - cfg.valid_fraction))
        train, valid = train[:cut], train[cut:]
    else:
        train, valid = split(train, cfg.valid_fraction, cfg.split_seed)
    if not train:
        raise DataError(f"no training examples in {', '.join(train_files)}")
    return train, valid, report


def build_dataset(cfg: DataConfig, arch: str, max_len: int,
                  tokenizers: tuple[Tokenizer, Tokenizer | None] | None = None,
                  labels: list[str] | None = None, cache: Path | None = None) -> Dataset:
    """Read, split and tokenise; train tokenizers unless given (as when resuming)."""
    task = TASKS[arch]
    train, valid, report = load_raw(cfg, task, cache)
    kind = "char" if cfg.dataset == "copy" else cfg.tokenizer
    if task == "translation":
        if tokenizers is None:
            if cfg.shared_vocab:
                src_tok = train_tokenizer(kind, [t for pair in train for t in pair],
                                          cfg.vocab_size)
                tokenizers = (src_tok, src_tok)
            else:
                tokenizers = (train_tokenizer(kind, [s for s, _ in train], cfg.vocab_size),
                              train_tokenizer(kind, [t for _, t in train], cfg.vocab_size))
        src_tok, tgt_tok = tokenizers
        ds = Dataset(task, [], [], src_tok, tgt_tok, raw_valid=valid, report=report)
        ds.train = [_pair(ds, s, t, max_len) for s, t in train]
        ds.valid = [_pair(ds, s, t, max_len) for s, t in valid]
        return ds
    if task == "classification":
        if tokenizers is None:
            tokenizers = (train_tokenizer(kind, [t for _, t in train], cfg.vocab_size), None)
        labels = labels or sorted({label for label, _ in train})
        index = {label: i for i, label in enumerate(labels)}
        unknown = sorted({label for label, _ in valid if label not in index})
        if unknown:
            raise DataError(f"validation labels {unknown} never occur in the training data")
        ds = Dataset(task, [], [], tokenizers[0], labels=labels, raw_valid=valid, report=report)
        ds.train = [(_classify_ids(ds, t, max_len), index[label]) for label, t in train]
        ds.valid = [(_classify_ids(ds, t, max_len), index[label]) for label, t in valid]
        return ds
    if tokenizers is None:
        tokenizers = (train_tokenizer(kind, [train], cfg.vocab_size), None)
    tok = tokenizers[0]
    ds = Dataset(task, torch.tensor(tok.encode(train), dtype=torch.long),
                 torch.tensor(tok.encode(valid), dtype=torch.long), tok, report=report)
    if ds.train.numel() < 2:
        raise DataError("the language-model training text is shorter than two tokens")
    return ds


def _clip(ds: Dataset, ids: list[int], limit: int) -> list[int]:
    if len(ids) > limit:
        ds.truncated += 1
        return ids[:limit]
    return ids


def classifier_input(tok: Tokenizer, text: str, max_len: int) -> tuple[list[int], bool]:
    """(ids, truncated) of a text for an encoder: <bos> text; a pretrained tokenizer adds its
    own specials instead (BERT: [CLS] text [SEP], cut so that [SEP] stays)."""
    if hasattr(tok, "encode_with_specials"):
        ids = tok.encode_with_specials([text])[0]
        return (ids, False) if len(ids) <= max_len else (ids[: max_len - 1] + ids[-1:], True)
    ids = [tok.bos_id] + tok.encode(text)
    return ids[:max_len], len(ids) > max_len


def _classify_ids(ds: Dataset, text: str, max_len: int) -> list[int]:
    ids, cut = classifier_input(ds.source_tokenizer, text, max_len)
    ds.truncated += cut
    return ids


def _pair(ds: Dataset, src: str, tgt: str, max_len: int) -> tuple[list[int], list[int]]:
    s = _clip(ds, ds.source_tokenizer.encode(src), max_len - 1) + [EOS_ID]
    t = [BOS_ID] + _clip(ds, ds.target_tokenizer.encode(tgt), max_len - 1) + [EOS_ID]
    return s, t
