"""Encoded datasets: a task's token ids on disk, read back through memory maps.

A corpus is read and tokenised once; training then reads batches straight from flat arrays
that the operating system pages in and shares between processes, so neither the corpus nor its
token ids ever sit in Python lists. Layout of one encoded dataset, ``CACHE/encoded/<name>/``::

    manifest.json         inputs (path, size, mtime, sha256), tokenizer checksums, options,
                          counts, skipped lines, truncations, the training data's fingerprint,
                          and every file's size and sha256
    train.<field>.bin     token ids of every example, back to back (uint16 when the vocabulary
                          fits, else uint32); a language model's text is one field, "tokens"
    train.<field>.off     int64 offsets: example i is bin[off[i]:off[i + 1]]
    train.label.bin       int32 class indices (classification)
    valid.*               the same for the validation split
    valid.raw.jsonl       the validation examples as read (for metrics that compare text)

A dataset is built in a private temporary folder and renamed into place when complete, so an
encoding cut short is never taken for a finished one (atomic.py ``building``). Every open checks
the files' sizes against the manifest and the counts in it (cheap); ``vaswani data clean
--verify`` checks their content. A damaged dataset is reported by file and encoded again, never
read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..atomic import building, file_sha256

FORMAT = 1
FLUSH_TOKENS = 1 << 20  # buffered token ids per field before a write
DTYPES = ("uint16", "uint32")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class Ragged:
    """Variable-length sequences stored flat: ``seq[i]`` is a read-only numpy array."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray) -> None:
        self.flat, self.offsets = flat, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.flat[self.offsets[i]: self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


class Split:
    """One split of a dataset of examples: ``split[i]`` is example i as a tuple of its fields
    (translation: (source ids, target ids); classification: (ids, label))."""

    def __init__(self, fields: dict[str, Ragged | np.ndarray]) -> None:
        self.fields = fields
        self.names = list(fields)

    def __len__(self) -> int:
        return len(next(iter(self.fields.values())))

    def __getitem__(self, i: int | slice) -> tuple | list[tuple]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return tuple(self.fields[name][i] for name in self.names)

    def __iter__(self) -> Iterator[tuple]:
        return (self[i] for i in range(len(self)))

    def lengths(self, name: str) -> np.ndarray:
        return self.fields[name].lengths()


class RawExamples:
    """The validation examples as read, from ``valid.raw.jsonl``; ``raw[:n]`` reads n."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __getitem__(self, s: slice) -> list:
        if not isinstance(s, slice) or s.start or s.step:
            raise TypeError("raw examples are read from the start: use raw[:n]")
        out = []
        if not self.path.exists():
            return out
        with self.path.open(encoding="utf-8") as f:
            for line in f:
                if s.stop is not None and len(out) >= s.stop:
                    break
                out.append(tuple(json.loads(line)))
        return out


class Writer:
    """Writes the fields of one split: ragged token fields, flat token streams and labels.
    Keeps a sha256 of everything it writes (the data's fingerprint)."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype) -> None:
        self.directory, self.split, self.dtype = directory, split, dtype
        self.files: dict[str, object] = {}
        self.buffers: dict[str, list[np.ndarray]] = {}
        self.buffered: dict[str, int] = {}
        self.offsets: dict[str, list[int]] = {}
        self.totals: dict[str, int] = {}
        self.examples = 0  # counted by the caller
        self.hash = hashlib.sha256()

    def _file(self, name: str, suffix: str = "bin"):
        key = f"{name}.{suffix}"
        if key not in self.files:
            self.files[key] = (self.directory / f"{self.split}.{key}").open("wb")
        return self.files[key]

    def add_sequences(self, name: str, seqs: list) -> None:
        """Append whole sequences (examples) to a ragged field."""
        offsets = self.offsets.setdefault(name, [0])
        for seq in seqs:
            arr = np.asarray(seq, dtype=self.dtype)
            self._buffer(name, arr)
            offsets.append(offsets[-1] + len(arr))

    def add_stream(self, name: str, ids) -> None:
        """Append token ids to a flat stream (a language model's text)."""
        self._buffer(name, np.asarray(ids).astype(self.dtype, copy=False))

    def add_labels(self, labels) -> None:
        arr = np.asarray(labels, dtype=np.int32)
        self.hash.update(arr.tobytes())
        self._file("label").write(arr.tobytes())
        self.totals["label"] = self.totals.get("label", 0) + len(arr)

    def _buffer(self, name: str, arr: np.ndarray) -> None:
        self.buffers.setdefault(name, []).append(arr)
        self.buffered[name] = self.buffered.get(name, 0) + len(arr)
        if self.buffered[name] >= FLUSH_TOKENS:
            self._flush(name)

    def _flush(self, name: str) -> None:
        if self.buffers.get(name):
            data = np.concatenate(self.buffers[name]).tobytes()
            self.hash.update(name.encode() + data)
            self._file(name).write(data)
            self.totals[name] = self.totals.get(name, 0) + self.buffered[name]
        self.buffers[name], self.buffered[name] = [], 0

    def close(self) -> dict:
        """Flush, write the offsets, close; returns {field: token count}."""
        for name in list(self.buffers):
            self._flush(name)
        for name, offsets in self.offsets.items():
            arr = np.asarray(offsets, dtype=np.int64)
            self.hash.update(arr.tobytes())
            self._file(name, "off").write(arr.tobytes())
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()
        return dict(self.totals)


def open_split(directory: Path, split: str, manifest: dict) -> Split | np.ndarray:
    """Map a split's files: a :class:`Split` of examples, or the flat token array of text."""
    dtype = np.dtype(manifest["dtype"])
    fields: dict[str, Ragged | np.ndarray] = {}
    for name, kind in manifest["fields"].items():
        path = directory / f"{split}.{name}.bin"
        if kind == "stream":
            return _map(path, dtype)
        if kind == "labels":
            fields[name] = _map(path, np.dtype(np.int32))
        else:
            fields[name] = Ragged(_map(path, dtype), _map(directory / f"{split}.{name}.off",
                                                          np.dtype(np.int64)))
    return Split(fields)


def _map(path: Path, dtype: np.dtype) -> np.ndarray:
    """A read-only memory map (an empty array for an empty file, which mmap refuses)."""
    if not path.exists() or path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def file_stats(paths: list[str]) -> list[dict]:
    """What identifies an input file's content cheaply: resolved path, size, mtime."""
    out = []
    for p in paths:
        st = Path(p).stat()
        out.append({"path": str(Path(p).resolve()), "size": st.st_size,
                    "mtime_ns": st.st_mtime_ns})
    return out


def key_of(description: dict) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:20]


def lookup(directory: Path, inputs: dict[str, list[dict]]) -> dict | None:
    """The manifest of a complete encoded dataset in ``directory`` whose input files are
    unchanged; None if there is none. A changed input is reported and the stale data removed."""
    manifest_path = directory / "manifest.json"
    if not manifest_path.exists():
        return None
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        manifest = {}
    recorded = {split: [{k: f[k] for k in ("path", "size", "mtime_ns")} for f in files]
                for split, files in manifest.get("inputs", {}).items()}
    if manifest.get("format") == FORMAT and recorded == inputs:
        damage = damaged(directory, manifest)
        if damage is None:
            return manifest
        what = f"{damage}: the encoded data is damaged"
    else:
        changed = [f["path"] for split in inputs for f, g in
                   zip(inputs[split], recorded.get(split, []), strict=False) if f != g]
        what = (f"{changed[0]} changed" if changed else "the inputs changed") + \
            f" since {directory.name} was encoded"
    print(f"vaswani: {what}; encoding again", flush=True, file=sys.stderr)
    shutil.rmtree(directory, ignore_errors=True)
    return None


def damaged(directory: Path, manifest: dict, *, content: bool = False) -> str | None:
    """Why the encoded dataset in ``directory`` cannot be trusted (naming the file), or None.
    Sizes are checked against the manifest's record and its counts; ``content``: every file's
    sha256 too (reads everything)."""
    try:
        expected = expected_sizes(manifest)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return f"{directory / 'manifest.json'}: {e}"
    for name, size in expected.items():
        path = directory / name
        actual = path.stat().st_size if path.exists() else 0
        if actual != size:
            return f"{path} holds {actual} bytes, the manifest says {size}"
    for name in expected:
        if name.endswith(".off") and expected[name]:
            last = int(np.fromfile(directory / name, dtype=np.int64, offset=expected[name] - 8)[0])
            tokens = expected[name[:-3] + "bin"] // np.dtype(manifest["dtype"]).itemsize
            if last != tokens:
                return f"{directory / name} ends at {last}, but its .bin holds {tokens} tokens"
    why = _out_of_range(directory, manifest, expected)
    if why is not None:
        return why
    if content:
        for name, record in manifest.get("files", {}).items():
            if file_sha256(directory / name) != record["sha256"]:
                return f"{directory / name}: its sha256 differs from the manifest's"
    return None


def _out_of_range(directory: Path, manifest: dict, expected: dict[str, int]) -> str | None:
    """A file whose numbers a model cannot take (bytes overwritten in place keep the sizes):
    a token id past the vocabulary, a class past the labels, offsets that go back. Reads the
    files once (through the page cache: well under a second a gigabyte)."""
    limit = manifest.get("token_limit")  # encoded datasets from before it: not checked
    for name, size in expected.items():
        if not size:
            continue
        path = directory / name
        if name.endswith(".label.bin"):
            labels = _map(path, np.dtype(np.int32))
            low, high = int(labels.min()), int(labels.max())
            if low < 0 or high >= len(manifest.get("labels") or []):
                return f"{path} holds class {low if low < 0 else high}, not one of the labels"
        elif name.endswith(".bin") and limit:
            top = int(_map(path, np.dtype(manifest["dtype"])).max())
            if top >= limit:
                return f"{path} holds token id {top}, past the vocabulary ({limit} tokens)"
        elif name.endswith(".off") and (np.diff(_map(path, np.dtype(np.int64))) < 0).any():
            return f"{path}: its offsets go back"
    return None


def expected_sizes(manifest: dict) -> dict[str, int]:
    """Each file's size in bytes: as recorded, and as the counts and dtype imply (which must
    agree). Raises ValueError naming the manifest entry that is impossible."""
    sizes = {name: _count(f"files.{name}.size", record["size"])
             for name, record in manifest.get("files", {}).items()}
    if "fields" not in manifest:  # a cached tokenizer: no counts
        return sizes
    if manifest["dtype"] not in DTYPES:
        raise ValueError(f"dtype {manifest['dtype']!r} is not one of {', '.join(DTYPES)}")
    width = np.dtype(manifest["dtype"]).itemsize
    for split in ("train", "valid"):
        counts = manifest["counts"][split]
        examples = _count(f"counts.{split}.examples", counts["examples"])
        for name, kind in manifest["fields"].items():
            if kind == "labels":
                implied = {f"{split}.{name}.bin": 4 * examples}
            else:
                tokens = _count(f"counts.{split}.tokens.{name}", counts["tokens"].get(name, 0))
                implied = {f"{split}.{name}.bin": width * tokens}
                if kind == "stream" and examples != tokens:
                    raise ValueError(f"counts.{split}.examples = {examples}, but a text's "
                                     f"examples are its {tokens} tokens")
                if kind == "ragged":
                    implied[f"{split}.{name}.off"] = 8 * (examples + 1) if examples else 0
            for file, size in implied.items():
                if sizes.setdefault(file, size) != size:
                    raise ValueError(f"{file}: {sizes[file]} bytes recorded, but the counts "
                                     f"imply {size}")
    return sizes


def _count(where: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} = {value!r} is not a count")
    return value


def build(directory: Path, write) -> dict:
    """Run ``write(tmp_dir) -> manifest`` in a private folder beside ``directory`` that is
    renamed into place when complete (``manifest.json`` written last); returns the manifest."""
    with building(directory) as tmp:
        manifest = write(tmp)
        manifest["files"] = {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
                             for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False))
    return manifest


def sha256_files(stats: list[dict]) -> list[dict]:
    """The stats with each file's sha256 (for the manifest: provenance of the data)."""
    return [{**s, "sha256": file_sha256(Path(s["path"]))} for s in stats]


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def catalogue(root: Path) -> list[dict]:
    """What ``root`` (CACHE/encoded) holds: one entry per complete encoded dataset, with
    ``damaged``: why it cannot be trusted (its sizes checked), or None."""
    out = []
    for path in sorted(root.glob("*/manifest.json")):
        try:
            manifest = json.loads(path.read_text())
            first = next(iter(manifest["inputs"].get("train", [])), {"path": "?"})["path"]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            manifest, first = {}, "?"
            damage = f"{path}: unreadable ({e})"
        else:
            damage = damaged(path.parent, manifest)
        counts = manifest.get("counts", {}).get("train", {}) if not damage else {}
        text = "stream" in manifest.get("fields", {}).values()
        out.append({"name": path.parent.name, "task": manifest.get("task", "?"),
                    "input": first, "examples": counts.get("examples", 0),
                    "unit": "tokens" if text else "examples", "damaged": damage,
                    "bytes": folder_size(path.parent)})
    return out


def verify(root: Path) -> list[str]:
    """Check every encoded dataset under ``root`` (CACHE/encoded) in full, sizes and sha256;
    remove the damaged ones (encoded again on first use). Returns one line per removal."""
    removed = []
    for path in sorted(root.glob("*/manifest.json")) if root.exists() else []:
        try:
            manifest = json.loads(path.read_text())
        except ValueError as e:
            damage = f"{path}: unreadable ({e})"
        else:
            damage = damaged(path.parent, manifest, content=True)
        if damage:
            shutil.rmtree(path.parent, ignore_errors=True)
            removed.append(f"{damage}; removed {path.parent.name} (encoded again on first use)")
    return removed


def clean(root: Path) -> int:
    """Remove every encoded dataset (and cached tokenizer) under ``root``; returns the bytes
    freed. They are encoded again on first use."""
    freed = folder_size(root) if root.exists() else 0
    shutil.rmtree(root, ignore_errors=True)
    return freed
