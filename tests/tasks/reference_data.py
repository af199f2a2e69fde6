"""The in-memory data path vaswani had before encoded datasets (commit e078973,
data/datasets.py), kept as the reference the memory-mapped path must equal: read every
example into Python lists, hold out by seed, train the tokenizer on all of it, encode example
by example."""

from __future__ import annotations

import hashlib
import random

import torch

from vaswani.data import files
from vaswani.data.files import ReadReport
from vaswani.data.tokenizers import train_tokenizer


def split(examples, fraction, seed):
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_valid = max(1, round(len(examples) * fraction)) if fraction > 0 else 0
    held = set(order[:n_valid])
    return ([e for i, e in enumerate(examples) if i not in held],
            [e for i, e in enumerate(examples) if i in held])


def reference(cfg, kind: str, task: str):
    """(train, valid, tokenizers, labels) as the old code built them."""
    d, max_len = cfg.data, cfg.model.max_len
    report = ReadReport(max_skip=d.max_skip)
    read = {"translation": lambda p, r: list(files.iter_translation(p, r)),
            "lm": files.read_text,
            "classification": lambda p, r: list(files.iter_classification(p, d.format, r))}[task]
    train = read(list(d.train), report)
    if d.valid:
        valid = read(list(d.valid), report)
    elif task == "lm":
        cut = int(len(train) * (1 - d.valid_fraction))
        train, valid = train[:cut], train[cut:]
    else:
        train, valid = split(train, d.valid_fraction, d.split_seed)
    if task == "translation":
        if d.shared_vocab:
            tok = train_tokenizer(kind, [t for pair in train for t in pair], d.vocab_size)
            src_tok = tgt_tok = tok
        else:
            src_tok = train_tokenizer(kind, [s for s, _ in train], d.vocab_size)
            tgt_tok = train_tokenizer(kind, [t for _, t in train], d.vocab_size)

        def pair(s, t):
            a = src_tok.encode(s)[: max_len - 1] + [src_tok.eos_id]
            b = [tgt_tok.bos_id] + tgt_tok.encode(t)[: max_len - 1] + [tgt_tok.eos_id]
            return a, b
        return ([pair(s, t) for s, t in train], [pair(s, t) for s, t in valid],
                (src_tok, tgt_tok), [])
    if task == "classification":
        tok = train_tokenizer(kind, [t for _, t in train], d.vocab_size)
        labels = sorted({label for label, _ in train})
        index = {label: i for i, label in enumerate(labels)}

        def example(label, text):
            return ([tok.bos_id] + tok.encode(text))[:max_len], index[label]
        return ([example(*e) for e in train], [example(*e) for e in valid], (tok, None),
                labels)
    tok = train_tokenizer(kind, [train], d.vocab_size)
    return (torch.tensor(tok.encode(train), dtype=torch.long),
            torch.tensor(tok.encode(valid), dtype=torch.long), (tok, None), [])


def fingerprint(train) -> str:
    """The old resume fingerprint."""
    h = hashlib.sha256()
    if isinstance(train, torch.Tensor):
        h.update(train.numpy().tobytes())
    else:
        for a, b in train:
            h.update(repr((a, b)).encode())
    return h.hexdigest()[:16]
