"""Encoding a task's ``[data]`` once, into the memory-mapped files of encoded.py, and finding
it again: later runs, ``--resume`` and every DDP rank map the same files.

Two kinds of data:

* examples (translation pairs, labelled texts): read in a stream; when there are no
  validation files the examples are counted and a validation set is held out by seed
  (:func:`held_out_mask`); then encoded in batches with the tokenizer's batch encoding (on all
  cores), each batch's examples sent to their split;
* text (language modelling): the files' lines joined by newlines; the last ``valid_fraction``
  of the characters is held out; the text is encoded in chunks that end only before a
  newline that follows a visible character, where a byte-level BPE cannot join across, so
  the ids are those of the whole text encoded at once.

The tokenizer learns from at most ``[data] tokenizer_sample`` characters (bytes, counted on
the files): a larger training set gives a seeded random sample of whole examples (or lines).
It is cached too, keyed by the inputs and the tokenizer options; the encoded data is keyed by
the inputs, the tokenizer's checksum and the task's options. An input file whose size or
modification time changed makes an entry stale: that is reported and the entry rebuilt.

What a task is to this module (the token layout, which fields it stores) is the
:class:`Encodable` protocol below; tasks/base.py ``Task`` implements it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np
from tqdm import tqdm

from ..atomic import one_at_a_time
from . import encoded, prepare
from .files import DataError, ReadReport, expand
from .tokenizers import Tokenizer, load_tokenizers, save_tokenizers

BATCH = 2048  # examples per encode_batch call
CHUNK_CHARS = 1 << 16  # about this many characters per text chunk (one encode_batch item)
CHUNKS_PER_BATCH = 16  # text chunks per encode_batch call (spread over the cores)


def progress_bar(what: str, total: int, enabled: bool) -> tqdm:
    """A progress bar over input bytes, in MB/s (stderr; a line per 30 s into a log file)."""
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1 << 20, desc=what,
                disable=not enabled, file=sys.stderr,
                mininterval=0.5 if sys.stderr.isatty() else 30)


class Encodable(Protocol):
    """What encoding needs of a task (tasks/base.py ``Task`` documents each method)."""

    config: object  # the run's RunConfig
    name: str  # "translation", "lm", ...: what a registry dataset is for
    FIELDS: dict[str, str]  # the encoded fields: "ragged", "labels" or "stream"
    labelled: bool  # its examples carry class labels (train_labels is asked for them)

    def iter_examples(self, paths: list[str], report: ReadReport) -> Iterator: ...
    def encoding_options(self) -> dict: ...
    def train_tokenizers_from(self, inputs: Inputs, kind: str) -> tuple: ...
    def train_labels(self, inputs: Inputs) -> list[str]: ...
    def encode_examples(self, examples: list, tokenizers, writer, ctx: dict) -> None: ...


@dataclass
class TaskData:
    """A run's training and validation data as token ids (memory-mapped), with its
    tokenizers.

    ``train``/``valid``: an :class:`~vaswani.data.encoded.Split` whose item i is example i as a
    tuple of arrays (translation: (source ids, target ids); classification: (ids, label)), or
    one array of token ids for language modelling. ``raw_valid[:n]``: the first validation
    examples as read (for metrics that compare text)."""

    train: object
    valid: object
    source_tokenizer: Tokenizer
    target_tokenizer: Tokenizer | None = None
    labels: list[str] = field(default_factory=list)
    raw_valid: object = field(default_factory=list)
    report: ReadReport = field(default_factory=ReadReport)
    truncated: int = 0
    manifest: dict = field(default_factory=dict)  # of the encoded dataset
    directory: Path | None = None  # where the encoded dataset lives

    def fingerprint(self) -> str:
        """A hash of the training token ids (from the encoded dataset's manifest): resuming
        on different data is caught."""
        return self.manifest["fingerprint"]

    def legacy_fingerprint(self) -> str:
        """The hash runs saved before encoded datasets recorded (over Python lists of ids),
        so that they still resume. Reads all the training data: only asked when needed."""
        h = hashlib.sha256()
        if isinstance(self.train, np.ndarray):
            for start in range(0, len(self.train), 1 << 24):
                h.update(np.asarray(self.train[start: start + (1 << 24)],
                                    dtype=np.int64).tobytes())
        else:
            for a, b in self.train:
                second = b.tolist() if isinstance(b, np.ndarray) else int(b)
                h.update(repr((a.tolist(), second)).encode())
        return h.hexdigest()[:16]


class Inputs:
    """A task's input files and what is decided about them once: which examples (or which
    characters) are held out for validation. Computed only when needed."""

    def __init__(self, task, files: dict[str, list[str]], progress: bool) -> None:
        self.task, self.files, self.progress = task, files, progress
        self.stats = {split: encoded.file_stats(paths) for split, paths in files.items()}

    def size(self, split: str) -> int:
        return sum(f["size"] for f in self.stats[split])

    @cached_property
    def held_out(self) -> np.ndarray | None:
        """Examples: True for each training-file example held out for validation (None when
        there are validation files)."""
        if self.files["valid"]:
            return None
        d = self.task.config.data
        n = sum(1 for _ in self.task.iter_examples(self.files["train"],
                                                   ReadReport(max_skip=d.max_skip)))
        if n == 0:
            raise DataError(f"no training examples in {', '.join(self.files['train'])}")
        return held_out_mask(n, d.valid_fraction, d.split_seed)

    @cached_property
    def cut(self) -> int | None:
        """Text: the character where validation text starts (None with validation files)."""
        if self.files["valid"]:
            return None
        d = self.task.config.data
        pieces = self.task.iter_examples(self.files["train"], ReadReport(max_skip=d.max_skip))
        total = sum(len(piece) for piece in pieces)
        return int(total * (1 - d.valid_fraction))

    def train_examples(self) -> Iterator:
        """The training examples (not held out), sampled for the tokenizer as
        ``[data] tokenizer_sample`` says."""
        mask, keep = self.held_out, self.sampler()
        report = ReadReport(max_skip=self.task.config.data.max_skip)
        for i, example in enumerate(self.task.iter_examples(self.files["train"], report)):
            if (mask is None or not mask[i]) and keep():
                yield example

    def sampler(self):
        """Whether the tokenizer learns from the next example or line: always when the
        training files hold at most ``tokenizer_sample`` bytes, else with probability
        sample / size, drawn with ``split_seed``."""
        limit, total = self.task.config.data.tokenizer_sample, self.size("train")
        if total <= limit:
            return lambda: True
        rng = random.Random(self.task.config.data.split_seed)
        return lambda: rng.random() < limit / total


def held_out_mask(n: int, fraction: float, seed: int) -> np.ndarray:
    """True for the ``round(n * fraction)`` (at least one) examples held out for validation:
    the first ones of a shuffle of range(n) by ``seed``."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_valid = max(1, round(n * fraction)) if fraction > 0 else 0
    if n_valid >= n:
        raise DataError(f"only {n} examples: too few to hold out a validation set")
    mask = np.zeros(n, dtype=bool)
    mask[order[:n_valid]] = True
    return mask


def load(task: Encodable, cache: Path, tokenizers=None, labels=None, *,
         progress: bool = True) -> TaskData:
    """The task's data over memory maps, encoding it first unless an unchanged encoding is
    in ``cache``. ``tokenizers`` (and ``labels``) given: those of a run being resumed or
    fine-tuned; otherwise they are trained (or found in the cache)."""
    d = task.config.data
    kind = d.tokenizer
    if d.dataset:
        spec = prepare.lookup(d.dataset)
        if spec.task != task.name:
            raise ValueError(f"dataset {d.dataset!r} is for {spec.task}, but the model does "
                             f"{task.name}")
        kind = spec.tokenizer or kind
    files = {split: [str(p) for p in expand(prepare.split_files(d, split, cache))]
             for split in ("train", "valid")}
    if not files["train"]:
        raise ValueError("[data] needs train files (or a dataset name)")
    inputs = Inputs(task, files, progress)
    root = cache / "encoded"
    options = {"max_len": task.config.model.max_len, "valid_fraction": d.valid_fraction,
               "split_seed": d.split_seed, "max_skip": d.max_skip, "format": d.format,
               **task.encoding_options()}
    names = {split: [f["path"] for f in v] for split, v in inputs.stats.items()}
    if tokenizers is None:
        tokenizers, labels = _tokenizers(task, root, inputs, names, kind, options)
    elif labels is None and task.labelled:
        labels = task.train_labels(inputs)  # fine-tuning a classifier: a head for these labels
    key = encoded.key_of({"task": task.name, "inputs": names, "labels": labels or [],
                          "tokenizer": _checksum(tokenizers, root), "options": options})
    directory = root / f"{task.name}-{key}"
    manifest = _built_once(directory, inputs, lambda tmp: _write(
        task, tmp, inputs, tokenizers, labels or [], options),
        f"encoded the {task.name} data into {directory}")
    report = ReadReport(max_skip=d.max_skip, skipped=list(manifest["report"]["skipped"]),
                        blank_lines=manifest["report"]["blank_lines"])
    return TaskData(encoded.open_split(directory, "train", manifest),
                    encoded.open_split(directory, "valid", manifest), tokenizers[0],
                    tokenizers[1], list(manifest["labels"]),
                    encoded.RawExamples(directory / "valid.raw.jsonl"), report,
                    manifest["truncated"], manifest, directory)


def _checksum(tokenizers: tuple[Tokenizer, Tokenizer | None], root: Path) -> str:
    """A checksum of the tokenizer(s), from their files as saved."""
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".checksum.", dir=root))
    try:
        save_tokenizers(scratch, *tokenizers)
        digests = json.loads((scratch / "meta.json").read_text())["sha256"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()[:20]


def _tokenizers(task, root, inputs, names, kind, options):
    """(tokenizers, labels): cached, or trained on (a sample of) the training data."""
    d = task.config.data
    key = encoded.key_of({"task": task.name, "inputs": names, "kind": kind,
                          "vocab_size": d.vocab_size, "shared": d.shared_vocab,
                          "sample": d.tokenizer_sample, "options": options})
    directory = root / "tokenizers" / f"{task.name}-{key}"
    def write(tmp: Path) -> dict:
        tokenizers = task.train_tokenizers_from(inputs, kind)
        save_tokenizers(tmp / "tokenizer", *tokenizers)
        labels = task.train_labels(inputs) if task.labelled else []
        return {"format": encoded.FORMAT, "inputs": inputs.stats, "labels": labels}
    manifest = _built_once(directory, inputs, write, f"trained the {kind} tokenizer")
    return load_tokenizers(directory / "tokenizer"), manifest["labels"]


def _built_once(directory: Path, inputs: Inputs, write, built: str) -> dict:
    """``directory``'s manifest: an unchanged encoding of ``inputs`` found there, or one
    built by ``write``; a second process encoding the same data at once waits, then uses it."""
    manifest = encoded.lookup(directory, inputs.stats)
    if manifest is None:
        with one_at_a_time(directory):
            manifest = encoded.lookup(directory, inputs.stats)
            if manifest is None:
                start = time.perf_counter()
                manifest = encoded.build(directory, write)
                print(f"vaswani: {built} ({time.perf_counter() - start:.1f} s)",
                      file=sys.stderr, flush=True)
    return manifest


def _write(task, tmp: Path, inputs: Inputs, tokenizers, labels, options) -> dict:
    start = time.perf_counter()
    dtype = encoded.token_dtype(max(t.vocab_size for t in tokenizers if t is not None))
    report = ReadReport(max_skip=task.config.data.max_skip)
    writers = {s: encoded.Writer(tmp, s, dtype) for s in ("train", "valid")}
    ctx = {"truncated": 0, "labels": labels}
    if task.FIELDS.get("tokens") == "stream":
        write_text(task, inputs, tokenizers[0], writers, report)
    else:
        write_examples(task, tmp, inputs, tokenizers, writers, ctx, report)
    counts = {}
    for split, writer in writers.items():
        tokens = writer.close()
        counts[split] = {"examples": writer.examples or tokens.get("tokens", 0),
                         "tokens": tokens}
    if not counts["train"]["examples"]:
        raise DataError(f"no training examples in {', '.join(inputs.files['train'])}")
    return {"format": encoded.FORMAT, "task": task.name, "fields": task.FIELDS,
            "dtype": dtype.name, "inputs": {s: encoded.sha256_files(v)
                                            for s, v in inputs.stats.items()},
            "tokenizer": {"kind": tokenizers[0].kind, "vocab_size": tokenizers[0].vocab_size},
            "token_limit": max(t.vocab_size for t in tokenizers if t is not None),
            "options": options, "labels": labels, "truncated": ctx["truncated"],
            "counts": counts, "fingerprint": writers["train"].hash.hexdigest()[:16],
            "report": {"skipped": report.skipped, "blank_lines": report.blank_lines},
            "encode_seconds": round(time.perf_counter() - start, 2)}


def write_examples(task, tmp: Path, inputs: Inputs, tokenizers, writers, ctx, report) -> None:
    """Examples to their splits, encoded a batch at a time; valid ones also as read."""
    mask = inputs.held_out
    with (tmp / "valid.raw.jsonl").open("w", encoding="utf-8") as raw:
        for split, paths in inputs.files.items():
            if not paths:
                continue
            bar = progress_bar(f"encoding {split}", inputs.size(split), inputs.progress)
            index, batch = 0, []
            for example in task.iter_examples(paths, report):
                batch.append(example)
                if len(batch) == BATCH:
                    index = _send(task, batch, index, split, mask, writers, raw, tokenizers,
                                  ctx, bar)
                    batch = []
            _send(task, batch, index, split, mask, writers, raw, tokenizers, ctx, bar)
            bar.close()


def _send(task, batch, index, split, mask, writers, raw, tokenizers, ctx, bar) -> int:
    """Encode one batch and send each example to its split; returns the next index."""
    if not batch:
        return index
    if split == "train" and mask is not None:
        held = mask[index: index + len(batch)]
        groups = {"train": [e for e, h in zip(batch, held, strict=True) if not h],
                  "valid": [e for e, h in zip(batch, held, strict=True) if h]}
    else:
        groups = {split: batch}
    for name, examples in groups.items():
        if examples:
            task.encode_examples(examples, tokenizers, writers[name], ctx)
            writers[name].examples += len(examples)
            if name == "valid":
                raw.writelines(json.dumps(list(e), ensure_ascii=False) + "\n" for e in examples)
    bar.update(sum(sum(len(x) for x in e if isinstance(x, str)) + 2 for e in batch))
    return index + len(batch)


SEAM = re.compile(r"\S\n")  # a visible character, then a newline: a safe place to cut


def text_chunks(pieces, cut: int | None, bar: tqdm | None = None):
    """("train" or "valid", chunk) of the text made of ``pieces``: characters before ``cut``
    are train, the rest valid (``cut`` None: all train). Chunks hold about CHUNK_CHARS
    characters and end only just before a newline that follows a visible character (or where
    train meets valid, or at the end), where a byte-level BPE cannot join across."""
    split, position, buffer = "train", 0, ""
    for piece in pieces:
        if bar is not None:
            bar.update(len(piece))
        if cut is not None and split == "train" and position + len(piece) >= cut:
            head, piece = piece[: cut - position], piece[cut - position:]
            yield from _cut(split, buffer + head, final=True)
            buffer, split, position = "", "valid", cut
        position += len(piece)
        buffer = yield from _cut(split, buffer + piece, final=False)
    if cut is not None and split == "train":
        yield from _cut("train", buffer, final=True)
        split, buffer = "valid", ""
    yield from _cut(split, buffer, final=True)


def _cut(split: str, text: str, *, final: bool):
    """Yield chunks of ``text`` that end at seams; return what is left (all, if final)."""
    start = 0
    while True:
        m = SEAM.search(text, start + CHUNK_CHARS - 1)
        if m is None:
            break
        yield split, text[start: m.start() + 1]
        start = m.start() + 1
    if final:
        yield split, text[start:]
        return ""
    return text[start:]


def write_text(task, inputs: Inputs, tokenizer: Tokenizer, writers, report) -> None:
    """A language model's text: train and valid token streams."""
    cut = inputs.cut
    if inputs.files["valid"]:
        sources = [("train", inputs.files["train"], None), ("valid", inputs.files["valid"], None)]
    else:
        sources = [("train", inputs.files["train"], cut)]
    for split, paths, split_cut in sources:
        bar = progress_bar(f"encoding {split}", inputs.size(split), inputs.progress)
        chunks: list[tuple[str, str]] = []
        for where, chunk in text_chunks(task.iter_examples(paths, report), split_cut, bar):
            where = where if split_cut is not None else split
            chunks.append((where, chunk))
            if len(chunks) >= CHUNKS_PER_BATCH:
                _encode_chunks(tokenizer, chunks, writers)
                chunks = []
        _encode_chunks(tokenizer, chunks, writers)
        bar.close()


def _encode_chunks(tokenizer: Tokenizer, chunks, writers) -> None:
    if not chunks:
        return
    for (where, _), ids in zip(chunks, tokenizer.encode_arrays([c for _, c in chunks]),
                               strict=True):
        writers[where].add_stream("tokens", ids)
