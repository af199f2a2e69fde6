"""Reading the user's files, with errors that name the file, the line and the problem.

Formats:

* translation: a TSV file of ``source<TAB>target`` lines, or two aligned plain-text files
  (line N of one translates line N of the other);
* language modelling: one or many plain-text files (globs allowed), read whole;
* classification: TSV (``label<TAB>text``, optionally under a ``label<TAB>text`` header),
  CSV with a header naming ``label`` and ``text`` columns, or JSONL objects with ``"label"``
  and ``"text"`` keys.

Blank lines are not examples; they are ignored and counted. Any other bad line (wrong column
count, empty field, invalid UTF-8, bad JSON, missing label) stops reading with a message
naming ``file:line``, unless ``max_skip`` allows skipping it: then it is counted, and the
report at the end of training lists the first few.

Files are streamed line by line (``iter_*``), so a corpus larger than memory can be read; the
``read_*`` functions collect the same examples into a list (or one string for text).
"""

from __future__ import annotations

import csv
import glob
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


class DataError(ValueError):
    """Bad input data; the message names the file and line."""


@dataclass
class ReadReport:
    """What reading skipped or ignored, so that nothing disappears unannounced."""

    max_skip: int = 0
    skipped: list[str] = field(default_factory=list)
    blank_lines: int = 0

    def bad_line(self, path: Path, line_no: int, problem: str) -> None:
        message = f"{path}:{line_no}: {problem}"
        if len(self.skipped) >= self.max_skip:
            hint = (f" (already skipped {len(self.skipped)}; " if self.max_skip else " (")
            raise DataError(message + hint + "raise [data] max_skip to skip bad lines)")
        self.skipped.append(message)

    def summary(self) -> str:
        parts = []
        if self.skipped:
            shown = "; ".join(self.skipped[:3])
            parts.append(f"skipped {len(self.skipped)} bad line(s) (max_skip={self.max_skip}): "
                         f"{shown}{' ...' if len(self.skipped) > 3 else ''}")
        if self.blank_lines:
            parts.append(f"ignored {self.blank_lines} blank line(s)")
        return "; ".join(parts)


def expand(paths: list[str]) -> list[Path]:
    """Paths with globs expanded; a path that matches nothing is an error."""
    out: list[Path] = []
    for p in paths:
        matches = sorted(glob.glob(p)) if any(c in p for c in "*?[") else [p]
        if not matches:
            raise FileNotFoundError(f"no file matches {p}")
        for m in matches:
            path = Path(m)
            if path.is_dir():
                raise DataError(f"{path} is a directory, not a data file (name the files, or "
                                f"a glob such as {path}/*.txt)")
            if not path.is_file():
                raise FileNotFoundError(f"data file not found: {path}")
            out.append(path)
    return out


MAX_LINE = 1 << 24  # bytes in one line of a TSV, CSV or JSONL file at most (16 MiB)


def _physical_lines(f) -> Iterator[bytes | None]:
    """The lines of an open binary file up to each \\n; None for one longer than ``MAX_LINE``
    (skipped without ever holding it in memory: never a 2 GiB string)."""
    while physical := f.readline(MAX_LINE + 1):
        if len(physical) > MAX_LINE and not physical.endswith(b"\n"):
            while (rest := f.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                pass
            yield None
            continue
        yield physical


def _numbered(path: Path, report: ReadReport) -> Iterator[tuple[int, str | None]]:
    """(line number, text) for every line of ``path``, read in a stream; ``None`` for a line
    that is not UTF-8 (reported). Lines end at \\n, \\r\\n or \\r, as ``bytes.splitlines``."""
    content = False
    line_no = 0
    with path.open("rb") as f:
        for physical in _physical_lines(f):
            if physical is None:
                line_no, content = line_no + 1, True
                report.bad_line(path, line_no, f"the line is too long (over {MAX_LINE >> 20} "
                                               "MiB)")
                yield line_no, None
                continue
            for line in physical.splitlines() or [b""]:
                line_no += 1
                content = content or bool(line.strip())
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as e:
                    report.bad_line(path, line_no, f"invalid UTF-8 (byte 0x{line[e.start]:02x} "
                                                   f"at column {e.start + 1})")
                    yield line_no, None
                    continue
                yield line_no, text.removeprefix("\ufeff") if line_no == 1 else text
    if not content:
        raise DataError(f"{path}: file is empty")


def read_lines(path: Path, report: ReadReport) -> Iterator[tuple[int, str]]:
    """(line number, text without the newline) for each line that decodes as UTF-8."""
    for line_no, text in _numbered(path, report):
        if text is not None:
            yield line_no, text


def _columns(path: Path, report: ReadReport, n: int, what: str):
    for line_no, text in read_lines(path, report):
        if not text.strip():
            report.blank_lines += 1
            continue
        cols = text.split("\t")
        if len(cols) != n:
            report.bad_line(path, line_no, f"expected {n} tab-separated columns ({what}), "
                                           f"found {len(cols)}")
            continue
        yield line_no, [c.strip() for c in cols]


def iter_translation(paths: list[str], report: ReadReport) -> Iterator[tuple[str, str]]:
    """Pairs from one TSV file, or from two aligned files."""
    files = expand(paths)
    if len(files) == 2:
        yield from _iter_aligned(files[0], files[1], report)
        return
    if len(files) != 1:
        raise DataError(f"translation data is one TSV file or two aligned files, got {len(files)}")
    for line_no, (src, tgt) in _columns(files[0], report, 2, "source, target"):
        if not src or not tgt:
            report.bad_line(files[0], line_no, f"empty {'source' if not src else 'target'}")
            continue
        yield src, tgt



def _iter_aligned(src_path: Path, tgt_path: Path, report: ReadReport):
    counts = [0, 0]
    for src, tgt in itertools.zip_longest(_numbered(src_path, report),
                                          _numbered(tgt_path, report)):
        counts[0] += src is not None
        counts[1] += tgt is not None
        if src is None or tgt is None:
            continue  # one file is longer: counted, reported below
        (line_no, s), (_, t) = src, tgt
        if s is None or t is None:  # that line was invalid UTF-8 in one file, already counted
            continue
        if not s.strip() and not t.strip():
            report.blank_lines += 1
            continue
        if not s.strip() or not t.strip():
            which = src_path if not s.strip() else tgt_path
            report.bad_line(which, line_no, "empty line where the other file has text")
            continue
        yield s.strip(), t.strip()
    if counts[0] != counts[1]:
        raise DataError(f"{src_path} has {counts[0]} lines but {tgt_path} has {counts[1]}; "
                        "aligned files need one line per example in each")


def iter_text(paths: list[str], report: ReadReport) -> Iterator[str]:
    """The lines of the files, in order, without newlines: a language model's text is these
    lines joined by newlines (files too are joined by a newline)."""
    for path in expand(paths):
        for _, text in read_lines(path, report):
            yield text


BLOCK = 1 << 20  # bytes read at a time by iter_text_pieces


def iter_text_pieces(paths: list[str], report: ReadReport, block: int = BLOCK) -> Iterator[str]:
    """Pieces of text whose concatenation is :func:`read_text` (the lines of the files
    joined by newlines), read a block at a time: a corpus larger than memory streams through
    at the speed of decoding. A block holding a line that is not UTF-8 is re-read line by line,
    so the line is reported (or skipped) with its number, exactly as :func:`iter_text` does."""
    joiner = ""  # files are joined by a newline, put before the next file's first piece
    for path in expand(paths):
        content, line_no, carry, tail = False, 0, b"", ""
        with path.open("rb") as f:
            while True:
                raw = f.read(block)
                data = carry + raw
                if raw:
                    end = data.rfind(b"\n") + 1  # whole lines only (\r\n stays together)
                    if end == 0:
                        carry = data
                        continue
                    data, carry = data[:end], data[end:]
                elif not data:
                    break
                else:
                    carry = b""
                if line_no == 0 and data.startswith(b"\xef\xbb\xbf"):
                    data = data[3:]
                lines = data.count(b"\n")
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    text = "".join(t + "\n" for t in _decoded_lines(path, data, line_no, report))
                content = content or bool(data.strip())
                if "\r" in text:
                    text = text.replace("\r\n", "\n").replace("\r", "\n")
                line_no += lines
                # the text so far minus its final newline, which belongs to the next line
                piece, tail = tail + text[:-1] if text.endswith("\n") else tail + text, \
                    "\n" if text.endswith("\n") else ""
                if piece:
                    yield joiner + piece
                    joiner = ""
                if not raw:
                    break
        if not content:
            raise DataError(f"{path}: file is empty")
        joiner = "\n"


def _decoded_lines(path: Path, data: bytes, first: int, report: ReadReport) -> Iterator[str]:
    """The lines of a block that holds invalid UTF-8: bad lines reported (or skipped)."""
    for n, line in enumerate(data.splitlines(), start=first + 1):
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as e:
            report.bad_line(path, n, f"invalid UTF-8 (byte 0x{line[e.start]:02x} at column "
                                     f"{e.start + 1})")


def read_text(paths: list[str], report: ReadReport) -> str:
    """The files joined by newlines, for language modelling."""
    return "\n".join(iter_text(paths, report))


def iter_classification(paths: list[str], fmt: str, report: ReadReport
                        ) -> Iterator[tuple[str, str]]:
    """(label, text) examples from TSV, CSV or JSONL files."""
    for path in expand(paths):
        kind = fmt if fmt != "auto" else detect_format(path)
        reader = {"tsv": _classification_tsv, "csv": _classification_csv,
                  "jsonl": _classification_jsonl}.get(kind)
        if reader is None:
            raise DataError(f"{path}: classification data must be tsv, csv or jsonl, not {kind}")
        yield from reader(path, report)



def detect_format(path: Path) -> str:
    suffix = path.suffix.lower()
    return {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}.get(suffix, "text")


def _labelled(path: Path, line_no: int, label, text, report: ReadReport):
    if label is None or str(label).strip() == "":
        report.bad_line(path, line_no, "label missing")
    elif text is None or not str(text).strip():
        report.bad_line(path, line_no, "text missing")
    else:
        return str(label).strip(), str(text).strip()
    return None


def _classification_tsv(path: Path, report: ReadReport):
    for line_no, (label, text) in _columns(path, report, 2, "label, text"):
        if line_no == 1 and (label.lower(), text.lower()) == ("label", "text"):
            continue  # header
        example = _labelled(path, line_no, label, text, report)
        if example:
            yield example


def _classification_csv(path: Path, report: ReadReport):
    # An invalid UTF-8 line reads as an empty one, so csv's line numbers stay the file's.
    reader = csv.DictReader(text or "" for _, text in _numbered(path, report))
    missing = {"label", "text"} - set(reader.fieldnames or [])
    if missing:
        raise DataError(f"{path}:1: CSV header {reader.fieldnames} lacks column(s) "
                        f"{sorted(missing)}")
    for row in reader:
        if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
            report.blank_lines += 1
            continue
        example = _labelled(path, reader.line_num, row.get("label"), row.get("text"), report)
        if example:
            yield example


def _classification_jsonl(path: Path, report: ReadReport):
    for line_no, text in read_lines(path, report):
        if not text.strip():
            report.blank_lines += 1
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            report.bad_line(path, line_no, f"invalid JSON ({e.msg} at column {e.colno})")
            continue
        if not isinstance(obj, dict):
            report.bad_line(path, line_no, "expected a JSON object with label and text")
            continue
        example = _labelled(path, line_no, obj.get("label"), obj.get("text"), report)
        if example:
            yield example
