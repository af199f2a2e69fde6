"""Tokenizers: character-level (ours) and byte-level BPE (Hugging Face ``tokenizers``).

Both reserve the same four special tokens at the same ids, stored with the model::

    <pad> = 0, <bos> = 1, <eos> = 2, <unk> = 3

A run directory keeps its tokenizers in ``tokenizer/``: ``meta.json`` says which file serves the
source and which the target (the same file when the vocabulary is shared), and each file is the
tokenizer itself (our JSON for char, Hugging Face's ``tokenizer.json`` format for BPE).

Imported checkpoints keep their own vocabulary and special ids: :class:`PretrainedTokenizer`
wraps their ``tokenizer.json`` and records which ids play pad/bos/eos/unk beside it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_text, file_sha256

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)


class Tokenizer:
    """What the rest of vaswani needs from a tokenizer."""

    kind = ""
    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; special tokens are dropped."""
        raise NotImplementedError

    def encode_prompt(self, text: str) -> list[int]:
        """A language model's prompt: :meth:`encode`, and for a pretrained tokenizer whose
        own template starts every text with a token (Gemma's and Llama 3's ``<bos>``), that
        token first, as its users' ``tokenizer(text)`` gives it."""
        return self.encode(text)

    def save(self, path: Path) -> None:
        raise NotImplementedError

    def token(self, i: int) -> str:
        """A readable label for one id (for attention plots)."""
        raise NotImplementedError

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        """Like :meth:`encode_batch`, as numpy arrays (what encoded datasets store)."""
        return [np.asarray(ids, dtype=np.int64) for ids in self.encode_batch(texts)]


class CharTokenizer(Tokenizer):
    """One id per character seen in training; lossless for text made of those characters.
    Characters never seen map to ``<unk>``."""

    kind = "char"

    def __init__(self, chars: Iterable[str]) -> None:
        self.itos = list(SPECIALS) + sorted(set(chars))
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("a character collides with a special token name")

    @classmethod
    def train(cls, texts: Iterable[str]) -> CharTokenizer:
        chars: set[str] = set()
        for t in texts:
            chars.update(t)
        return cls(chars)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(c, UNK_ID) for c in text]

    def encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        """Vectorised: code points -> ids through a lookup table (characters beyond the
        table, or never seen, are <unk>)."""
        table = self._table()
        out = []
        for text in texts:
            points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
            ids = np.full(len(points), UNK_ID, dtype=np.int64)
            inside = points < len(table)
            ids[inside] = table[points[inside]]
            out.append(ids)
        return out

    def _table(self) -> np.ndarray:
        if getattr(self, "_lookup", None) is None:
            top = max((ord(c) for c in self.stoi if len(c) == 1), default=0) + 1
            table = np.full(top, UNK_ID, dtype=np.int64)
            for c, i in self.stoi.items():
                if len(c) == 1:
                    table[ord(c)] = i
            self._lookup = table
        return self._lookup

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.itos[i] for i in ids if i >= len(SPECIALS))

    def token(self, i: int) -> str:
        return self.itos[i]

    def save(self, path: Path) -> None:
        chars = self.itos[len(SPECIALS):]
        path.write_text(json.dumps({"kind": "char", "specials": list(SPECIALS), "chars": chars},
                                   ensure_ascii=False))

    @classmethod
    def load(cls, path: Path) -> CharTokenizer:
        data = json.loads(path.read_text())
        if data.get("specials") != list(SPECIALS):
            raise ValueError(f"{path}: special tokens {data.get('specials')} are not {SPECIALS}")
        return cls(data["chars"])


class BPETokenizer(Tokenizer):
    """Byte-level BPE (GPT-2 style) trained with Hugging Face ``tokenizers``: any text encodes
    without ``<unk>``, and decoding gives the text back."""

    kind = "bpe"

    def __init__(self, hf_tokenizer) -> None:
        self.hf = hf_tokenizer
        for i, name in enumerate(SPECIALS):
            if self.hf.token_to_id(name) != i:
                raise ValueError(f"BPE tokenizer must have {name} at id {i}")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        hf = HFTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        hf.train_from_iterator(texts, trainer=trainer)
        return cls(hf)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(texts)]

    def encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return _fast_arrays(self.hf, texts, add_special_tokens=True)

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def token(self, i: int) -> str:
        return self.hf.decode([i], skip_special_tokens=False)

    def save(self, path: Path) -> None:
        self.hf.save(str(path))

    @classmethod
    def load(cls, path: Path) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        return cls(HFTokenizer.from_file(str(path)))


class PretrainedTokenizer(Tokenizer):
    """A pretrained model's own Hugging Face tokenizer (WordPiece for BERT, byte-level BPE for
    LLaMA-family models), with its special ids. ``encode`` adds no special tokens;
    ``encode_with_specials`` applies the tokenizer's own template (BERT: [CLS] ... [SEP])."""

    kind = "pretrained"

    def __init__(self, hf_tokenizer, specials: dict[str, int]) -> None:
        self.hf = hf_tokenizer
        self.hf.no_padding()
        self.hf.no_truncation()
        self.specials = dict(specials)
        self.pad_id = specials["pad"]
        self.bos_id = specials["bos"]
        self.eos_id = specials["eos"]
        self.unk_id = specials.get("unk", specials["pad"])

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=False)]

    def encode_with_specials(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=True)]

    def encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return _fast_arrays(self.hf, texts, add_special_tokens=False)

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    @functools.cached_property
    def prompt_start(self) -> list[int]:
        """The ids this tokenizer's own template puts before a text (``<bos>`` for Gemma and
        Llama 3; none for most)."""
        plain = self.hf.encode("a", add_special_tokens=False).ids
        full = self.hf.encode("a", add_special_tokens=True).ids
        starts = [i for i in range(len(full) - len(plain) + 1)
                  if full[i:i + len(plain)] == plain]
        return full[:starts[0]] if plain and starts else []

    def encode_prompt(self, text: str) -> list[int]:
        """:meth:`encode` after :attr:`prompt_start`, unless the text brings it already (a
        chat template that writes ``<bos>`` itself)."""
        ids, start = self.encode(text), self.prompt_start
        return ids if ids[:len(start)] == start else start + ids

    def token(self, i: int) -> str:
        return self.hf.id_to_token(i) or f"<{i}>"

    def save(self, path: Path) -> None:
        self.hf.save(str(path))
        _specials_path(path).write_text(json.dumps(self.specials, indent=2))

    @classmethod
    def load(cls, path: Path) -> PretrainedTokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        return cls(HFTokenizer.from_file(str(path)), json.loads(_specials_path(path).read_text()))


def _fast_arrays(hf, texts: list[str], *, add_special_tokens: bool) -> list[np.ndarray]:
    """Hugging Face batch encoding (parallel over texts, offsets not computed) as arrays."""
    encode = getattr(hf, "encode_batch_fast", hf.encode_batch)
    return [np.asarray(e.ids, dtype=np.int64)
            for e in encode(texts, add_special_tokens=add_special_tokens)]


def _specials_path(path: Path) -> Path:
    return path.with_name(path.stem + ".specials.json")


def token_strings(tokenizer: Tokenizer) -> list[str]:
    """Every id's token string: the ``tokenizers`` model's own names where there is one (a
    byte-level BPE shows several ids alike once decoded), else vaswani's labels."""
    hf = getattr(tokenizer, "hf", None)
    return [hf.id_to_token(i) if hf is not None else tokenizer.token(i)
            for i in range(tokenizer.vocab_size)]


KINDS = {"char": CharTokenizer, "bpe": BPETokenizer, "pretrained": PretrainedTokenizer}


def train_tokenizer(kind: str, texts: Iterable[str], vocab_size: int) -> Tokenizer:
    if kind == "char":
        return CharTokenizer.train(texts)
    if kind == "bpe":
        return BPETokenizer.train(texts, vocab_size)
    raise ValueError(f"tokenizer ({kind!r}) must be 'char' or 'bpe'")


def save_tokenizers(directory: Path, source: Tokenizer, target: Tokenizer | None = None) -> None:
    """Write one file per distinct tokenizer, then ``directory/meta.json`` (which says which
    file serves which side, with each file's sha256)."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = {"source": {"kind": source.kind, "file": "source.json"}}
    source.save(directory / "source.json")
    if target is not None:
        if target is source:
            meta["target"] = meta["source"]
        else:
            meta["target"] = {"kind": target.kind, "file": "target.json"}
            target.save(directory / "target.json")
    files = sorted(p.name for p in directory.iterdir() if p.name != "meta.json")
    meta["sha256"] = {name: file_sha256(directory / name) for name in files}
    atomic_write_text(directory / "meta.json", json.dumps(meta, indent=2))


def load_tokenizers(directory: Path) -> tuple[Tokenizer, Tokenizer | None]:
    """(source, target) tokenizers of a run; target is None for one-sided tasks and is the
    same object as source when the vocabulary is shared."""
    meta_path = directory / "meta.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"no tokenizer in {directory} (missing meta.json)")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{meta_path} is damaged ({e})") from None
    for name, digest in meta.get("sha256", {}).items():
        path = directory / name
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing (listed in {meta_path})")
        if file_sha256(path) != digest:
            raise ValueError(f"{path} is damaged: it does not match the checksum written with "
                             "it; restore the run's tokenizer/ folder")
    loaded: dict[str, Tokenizer] = {}
    for side in ("source", "target"):
        entry = meta.get(side)
        if entry is None or entry["file"] in loaded:
            continue
        if entry["kind"] not in KINDS:
            raise ValueError(f"{meta_path}: unknown tokenizer kind {entry['kind']!r}")
        loaded[entry["file"]] = KINDS[entry["kind"]].load(directory / entry["file"])
    source = loaded[meta["source"]["file"]]
    target = loaded[meta["target"]["file"]] if "target" in meta else None
    return source, target
