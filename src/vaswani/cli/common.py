"""What several command groups share: the cache folder, a run loaded for use, input lines."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

# cpu/quantized.py's QUANTIZE (not imported: it imports torch)
QUANTIZE = ("int8", "int4", "int4-g64")
# (argparse formats help with %: a percent sign is written %%)
QUANTIZE_HELP = ("int8: the linear layers with int8 weights (a language model keeps float "
                 "inputs, so a completion is the same in any batch; a translator's and an "
                 "encoder's inputs are quantized per call: faster in batches); int4: a language "
                 "model's weights in 4 bits, in groups of 32 (int4-g64: of 64, 10%% fewer bytes "
                 "read a token, a little less exact). A language model's token table "
                 "(and a head tied to it) in int8 rows either way. A CPU only; a little less "
                 "exact (docs/performance.md)")

FAST_PREFILL_HELP = ("with --quantize int8, a language model: multiply prompts of 16 tokens or "
                     "more in bfloat16, the int8 levels widened exactly (the int8 kernel's "
                     "arithmetic up to one rounding; SmolLM2's prompts about twice as fast: "
                     "docs/performance.md). Default: on where the CPU has bfloat16 products "
                     "(AVX512-BF16 or AMX); --no-fast-prefill: the int8 kernel throughout")

# engine/config.py's KV_CACHE (not imported: it imports torch)
KV_CACHE = ("bf16",)
KV_CACHE_HELP = ("keep the decoder's keys and values in bfloat16: half the cache's memory a "
                 "token (twice the tokens, or rows, in the same memory) and half the bytes a "
                 "long context reads each step; each key rounded to bfloat16, so a token may "
                 "differ from the float cache's where two are nearly tied. A compiled step is "
                 "built for it apart (vaswani compile RUN --kv-cache bf16); default: the "
                 "model's dtype")

CACHE_HELP = "dataset cache (default $VASWANI_CACHE, else ~/.cache/vaswani)"
# every character str.splitlines() breaks a line at
LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def one_line(text: str, *, tabs: bool = False) -> str:
    """``text`` as one line of output: each line break in it becomes a space (a byte-level BPE
    model can write the newline byte: a half-trained translator did, 13 times in a verse), so
    that a command that writes one line per input keeps to it; with ``tabs``, tabs too (a
    tab-separated line keeps its columns)."""
    text = LINE_BREAKS.sub(" ", text)
    return text.replace("\t", " ") if tabs else text


def cache_dir(args: argparse.Namespace) -> Path:
    """--cache, else $VASWANI_CACHE, else ~/.cache/vaswani."""
    from ..data.registry import default_cache

    if getattr(args, "cache", None):
        path, where = Path(args.cache), "--cache"
    else:
        path, where = Path(os.environ.get("VASWANI_CACHE") or default_cache()), "the cache"
    if path.exists() and not path.is_dir():
        raise ValueError(f"{where} {path} is a file, not a directory")
    return path


def positive(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    return _at_least(text, 1)


def nonnegative(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    return _at_least(text, 0)


def _at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {low}")
    return value


def load_run(args: argparse.Namespace):
    """RUN_DIR loaded for use (--device, --weights, --engine, --quantize, --kv-cache,
    --fast-prefill, --eager, --workers)."""
    from ..inference import load

    return load(args.run_dir, device=args.device, weights=args.weights,
                engine=getattr(args, "engine", "vaswani"),
                quantize=getattr(args, "quantize", None),
                kv_cache=getattr(args, "kv_cache", None),
                fast_prefill=getattr(args, "fast_prefill", None),
                workers=getattr(args, "workers", 1), **eager(args))


SPECULATE_HELP = ("guess up to N tokens after each one, from the context (prompt lookup) or "
                  "a --draft model, and check them in its forward pass: the same output, in "
                  "fewer passes where the guesses hold (language models; eager or compiled; "
                  "0 = off, the default from [decode] speculate)")
DRAFT_HELP = ("guess with a draft model: a smaller language-model run of the same vocabulary "
              "decodes N tokens after each one (--speculate N; default 4), instead of "
              "looking them up in the context (the same --device, --quantize, --eager)")
DRAFT_GUESSES = 4  # --draft's tokens per guess where --speculate and [decode] name none


def set_draft(args: argparse.Namespace, runs) -> None:
    """--draft RUN_DIR loaded as every language model's in ``runs`` (engine/draft.py), which
    then speculate ``DRAFT_GUESSES`` tokens where --speculate and [decode] say nothing."""
    if not getattr(args, "draft", None):
        return
    from ..inference import load

    draft = load(args.draft, device=args.device, quantize=getattr(args, "quantize", None),
                 **eager(args))
    for run in runs:
        if run.decodes and not run.family.cross:
            run.set_draft(draft)
            if args.speculate is None and not run.config.decode.speculate:
                run.set_decode(speculate=DRAFT_GUESSES)


EAGER_HELP = ("decode eagerly, without the step `vaswani compile` built for the run (the "
              "reference; default: use it where it was built for this machine)")


def eager(args: argparse.Namespace) -> dict:
    """load()'s ``compiled`` for --eager: False (eager), else unset (a package if built)."""
    return {"compiled": False} if getattr(args, "eager", False) else {}


def read_lines(path: str | None) -> list[str]:
    """Input lines from a file or stdin, without their newlines (blank lines kept). A line
    that is not UTF-8 is an error naming it."""
    if path:
        if Path(path).is_dir():
            raise ValueError(f"--input {path} is a directory, not a file of lines")
        if not Path(path).exists():
            raise FileNotFoundError(f"input file not found: {path}")
        if not Path(path).is_file():  # /dev/zero, a FIFO: never-ending or not a file of lines
            raise ValueError(f"--input {path} is not a regular file (a device, a pipe or a "
                             "socket); give a file of lines, or pipe it to stdin")
        raw, where = Path(path).read_bytes(), path
    else:
        stream = getattr(sys.stdin, "buffer", None)  # a text stream in tests (StringIO)
        raw = stream.read() if stream is not None else sys.stdin.read().encode()
        where = "<stdin>"
    lines = []
    for n, line in enumerate(raw.splitlines(), start=1):
        try:
            lines.append(line.decode("utf-8").removeprefix("\ufeff") if n == 1
                         else line.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{where}:{n}: not valid UTF-8 (byte 0x{line[e.start]:02x} at "
                             f"column {e.start + 1})") from None
    return lines

