"""Run directories: what ``vaswani train`` and ``vaswani import`` write, and what every other
command (and ``vaswani.load``) reads. This package knows the layout of ``RUN_DIR`` and reads
and writes its description (here) and holds its lock (lock.py); the weights and checkpoints
in it are checkpoint/'s, and every write goes through atomic.py::

    config.toml          the fully resolved config (vocabulary sizes and labels filled in;
                         what a named [model] architecture fixes left out)
    tokenizer/           meta.json + the tokenizer file(s)
    model.safetensors    the best weights so far (by [train] best_metric)
    last/                the latest state, enough to resume exactly:
        model.safetensors
        trainer.pt       optimizer, scheduler and RNG state (tensors and numbers only)
        state.json       step, batches consumed, best metric, data fingerprint
        sharded/         with [train] parallel = "fsdp": every rank's slices of the weights
                         and the optimizer (torch.distributed.checkpoint), what it resumes from
    checkpoints/         with [train] keep_checkpoints = N: the weights of the last N
        step-000500.safetensors ...   checkpoints (one per save_every steps)
    averaged.safetensors their average (`vaswani average`, and at the end of training)
    metrics.jsonl        one JSON object per log line
    loss.png             the loss curves, drawn when training ends
    launcher.json        under torchrun: the job that started the run (its restarts resume it)
    compiled/            `vaswani compile`: the decode step compiled for this machine
        decode-float.pt2, decode-float.json ...   (engine/compiled.py), one per quantization
        decode-int4-kv-bf16.pt2 ...               and key/value cache (--kv-cache bf16)
        decode-float-encoder.pt2, ...             a translator's: its encoder pass,
        decode-float-few.pt2, ...                 and its steps of a few rows
        decode-float.<crc32>.so ...               each package's library, unpacked

    vaswani_run.json     the manifest: every path above that vaswani wrote here

``tokenizer/meta.json`` holds the sha256 of each tokenizer file: a damaged one is an error
naming it. One process at a time: training and import hold ``RUN_DIR/.lock`` (lock.py).

Nothing of the user's is ever removed. Each write is listed in the manifest before it is made
(:func:`record`), and starting over (``--overwrite``, or after a start that saved no weights)
removes only the listed files, and only those of vaswani's layout (:func:`in_layout`: a
manifest entry outside it claims nothing); a file vaswani did not write that lies where a run writes
(``last/notes.txt``, a ``model.safetensors`` of the user's) makes the start refuse, naming it,
before anything is touched. A run written before the manifest existed is recognised by its
layout (:data:`LAYOUT`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import socket
import sys
import warnings
from pathlib import Path

from .. import architectures
from ..atomic import atomic_write_text
from ..config import RunConfig, load_run_config
from ..data.tokenizers import Tokenizer, load_tokenizers, save_tokenizers
from .lock import LOCK, NotOurLock, RunInUse, locked  # noqa: F401 (rundir.locked, ...)

COMPLETE = "COMPLETE"
CONFIG, TOKENIZER, BEST, LAST, METRICS, LOSS_PLOT = (
    "config.toml", "tokenizer", "model.safetensors", "last", "metrics.jsonl", "loss.png")
CHAT_TEMPLATE = "chat_template.jinja"  # an imported chat model's own prompt format
CHECKPOINTS, AVERAGED = "checkpoints", "averaged.safetensors"
SHARDED = "sharded"  # in last/: a sharded run's state; sharded.tmp/ in RUN_DIR while written
LAUNCHER = "launcher.json"  # under torchrun: the job that started the run (its restarts resume)
TENSORBOARD = "tensorboard"  # [train] tensorboard = true: SummaryWriter's event files
COMPILED = "compiled"  # `vaswani compile`: AOTInductor packages of the decode step
COMPILED_LIBRARIES = f"{COMPILED}/decode-*.so"  # each package's library, unpacked
MANIFEST = "vaswani_run.json"  # the paths vaswani wrote in the run directory
# Every path vaswani writes in a run directory, as the manifest lists them ("DIR/*": a folder
# whose files a library names, written whole). A run from before the manifest is read as this.
TOKENIZER_FILES = tuple(f"{TOKENIZER}/{name}" for name in (
    "meta.json", "source.json", "source.specials.json", "target.json", "target.specials.json"))
LAYOUT = (CONFIG, *TOKENIZER_FILES, CHAT_TEMPLATE, BEST, f"{LAST}/{BEST}", f"{LAST}/trainer.pt",
          f"{LAST}/state.json", f"{LAST}/{COMPLETE}", f"{LAST}/{SHARDED}/*",
          f"{CHECKPOINTS}/step-*.safetensors", AVERAGED, METRICS, LOSS_PLOT, LAUNCHER,
          f"{TENSORBOARD}/*", f"{COMPILED}/decode-*.pt2", f"{COMPILED}/decode-*.json",
          COMPILED_LIBRARIES)
# What a name with "*" in LAYOUT stands for: file names matched a path segment at a time (a
# "*" never crosses a "/"), each as narrow as the library that writes them names its files
# (torch.distributed.checkpoint's shards and metadata; SummaryWriter's event files).
PATTERNS = {f"{LAST}/{SHARDED}/*": (f"{LAST}/{SHARDED}/.metadata",
                                    f"{LAST}/{SHARDED}/__*_*.distcp",
                                    f"{LAST}/{SHARDED}/__*.metadata"),
            f"{TENSORBOARD}/*": (f"{TENSORBOARD}/events.out.tfevents.*",),
            f"{CHECKPOINTS}/step-*.safetensors": (f"{CHECKPOINTS}/step-*.safetensors",),
            f"{COMPILED}/decode-*.pt2": (f"{COMPILED}/decode-*.pt2",),
            f"{COMPILED}/decode-*.json": (f"{COMPILED}/decode-*.json",),
            COMPILED_LIBRARIES: (COMPILED_LIBRARIES,)}
# The names at the top of a run directory that belong to vaswani: a file of the user's there,
# or in a folder of that name, is in a run's way.
RUN_NAMES = frozenset({p.split("/")[0] for p in LAYOUT} | {"last.tmp", "last.old",
                                                              SHARDED + ".tmp", MANIFEST})


class Refused(FileExistsError):
    """A run directory cannot be started in; nothing in it was touched."""


# --- the run's description: config and tokenizers -------------------------------------------

def write_run(run_dir: Path, config: RunConfig, source: Tokenizer, target: Tokenizer | None,
              labels: list[str], *, header: str = "", chat_template: str | None = None) -> None:
    """``config.toml`` (resolved, written last; a named architecture's fixed settings left
    out), ``tokenizer/`` (with the class labels, if
    any) and an imported chat model's ``chat_template.jinja``."""
    record(run_dir, *TOKENIZER_FILES, CONFIG,
           *([CHAT_TEMPLATE] if chat_template else []))
    save_tokenizers(run_dir / TOKENIZER, source, target)
    if chat_template:
        atomic_write_text(run_dir / CHAT_TEMPLATE, chat_template)
    if labels:
        meta_path = run_dir / TOKENIZER / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta["labels"] = labels
        atomic_write_text(meta_path, json.dumps(meta, indent=2))
    atomic_write_text(run_dir / CONFIG, header + config.to_toml(fixed=architectures.fixes))


def read_config(run_dir: Path, overrides: list[str] = ()) -> RunConfig:
    """The run's config (with ``--set`` overrides; what its named architecture fixes filled
    in); a missing one, or one that names an architecture vaswani does not know
    (``[model] architecture``), is a clear error."""
    if not (run_dir / CONFIG).exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {CONFIG}); train one "
                                "with `vaswani train CONFIG.toml --out RUN_DIR`")
    return load_run_config(run_dir / CONFIG, overrides, fixed=architectures.fixes)


def read_tokenizers(run_dir: Path) -> tuple[Tokenizer, Tokenizer | None, list[str]]:
    """(source tokenizer, target tokenizer or None, class labels) of a run."""
    source, target = load_tokenizers(run_dir / TOKENIZER)
    meta = json.loads((run_dir / TOKENIZER / "meta.json").read_text())
    return source, target, meta.get("labels", [])


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run worth keeping: a config and weights (best or a
    complete checkpoint). A start that never saved weights is not one."""
    if not (run_dir / CONFIG).exists():
        return False
    if (run_dir / BEST).exists():
        return True
    return any((run_dir / name / COMPLETE).exists() for name in (LAST, "last.tmp", "last.old"))


def read_chat_template(run_dir: Path) -> str | None:
    path = run_dir / CHAT_TEMPLATE
    return path.read_text() if path.exists() else None


def start(run_dir: Path, overwrite: bool) -> None:
    """Make ``run_dir`` ready for a new run (call it holding the lock).

    Refused, with nothing touched: a run already there unless ``overwrite``; a file vaswani did
    not write lying where a run writes (always); any other file unless ``overwrite`` (which
    keeps it). What a start left without saving any weights (killed during start-up, or an error
    before the first checkpoint) is cleared with a message. Only listed files are removed."""
    owned, in_the_way, others = survey(run_dir)
    if in_the_way:
        raise Refused(f"{run_dir} holds {_some(in_the_way)}, which vaswani did not write and a "
                      "run would replace; move them, or choose another --out")
    if holds_run(run_dir) and not overwrite:
        raise Refused(f"{run_dir} already holds a run; continue it with --resume {run_dir}, "
                      "choose another --out, or pass --overwrite")
    if others and not overwrite:
        raise Refused(f"{run_dir} is not empty ({_some(others)}); choose another --out, or pass "
                      "--overwrite (which removes only the files vaswani wrote)")
    if owned and not overwrite:
        print(f"vaswani: {run_dir} holds the start of a run that saved no weights; starting "
              "over", file=sys.stderr, flush=True)
    remove_run_files(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


# --- the manifest: what vaswani wrote ---------------------------------------------------------

def record(run_dir: Path, *paths: str) -> None:
    """List ``paths`` (relative to ``run_dir``, "/"-separated; "DIR/*" for a folder a library
    fills) in the manifest. Called before the write, by the one process that writes: a kill
    between the two leaves a listed path that does not exist, never an unlisted file."""
    listed = written(run_dir)
    new = [p for p in paths if p not in listed]
    if new:
        atomic_write_text(run_dir / MANIFEST,
                          json.dumps({"written": sorted({*listed, *new})}, indent=1) + "\n")


def written(run_dir: Path) -> list[str]:
    """The paths the manifest lists that lie in vaswani's layout (any other entry, ``*`` or
    ``checkpoints/*`` or a user's file name, is ignored: a manifest can only give back what
    vaswani writes); for a run written before the manifest existed (a config, weights and a
    tokenizer, no manifest), its layout; for anything else, none."""
    try:
        names = json.loads((run_dir / MANIFEST).read_text())["written"]
        return [n for n in names if isinstance(n, str) and in_layout(n)]
    except FileNotFoundError:
        legacy = holds_run(run_dir) and (run_dir / TOKENIZER / "meta.json").is_file()
        return list(LAYOUT) if legacy else []
    except (OSError, ValueError, KeyError, TypeError):
        return []  # a damaged manifest claims nothing: nothing is removed by it


def _matches(rel: str, pattern: str) -> bool:
    """``rel`` matches ``pattern`` segment by segment: a ``*`` never crosses a ``/``."""
    parts, wanted = rel.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(
        fnmatch.fnmatchcase(part, want) for part, want in zip(parts, wanted, strict=True))


def in_layout(name: str) -> bool:
    """Whether a manifest entry names something of vaswani's layout: one of its names (a
    pattern only as LAYOUT spells it), or a file one of its patterns matches."""
    if name in LAYOUT:
        return True
    return "*" not in name and any(_matches(name, p) for ps in PATTERNS.values() for p in ps)


def _listed_as(rel: str) -> str:
    """The manifest's name for a file: an atomic write's ``NAME.tmp`` is ``NAME``;
    ``last.tmp/`` and ``last.old/`` (checkpoint.save_last's swap) are ``last/``, and
    ``sharded.tmp/`` (a sharded save before the swap) is ``last/sharded/``."""
    first, _, rest = rel.partition("/")
    first = {"last.tmp": LAST, "last.old": LAST, SHARDED + ".tmp": f"{LAST}/{SHARDED}"}.get(
        first, first)
    return (f"{first}/{rest}" if rest else first).removesuffix(".tmp")


def survey(run_dir: Path) -> tuple[list[str], list[str], list[str]]:
    """(vaswani's files, the files of others that lie where a run writes, the other entries at
    the top of ``run_dir``), as sorted relative paths."""
    if not run_dir.is_dir():
        return [], [], []
    listed = written(run_dir)
    exact = {p for p in listed if "*" not in p}
    patterns = [q for p in listed if "*" in p for q in PATTERNS[p]]
    # last.tmp/ and last.old/ are checkpoint.save_last's scratch: once a run has listed last/,
    # whatever a save killed part-way left in them (a library's temporary file) is its own
    scratch = any(p.startswith(f"{LAST}/") for p in listed)
    owned, in_the_way, others = [], [], []
    for entry in sorted(run_dir.iterdir()):
        if entry.name in (LOCK, MANIFEST):
            continue
        if entry.name not in RUN_NAMES:
            others.append(entry.name)
            continue
        files = [entry] if not entry.is_dir() or entry.is_symlink() else sorted(
            p for p in entry.rglob("*") if not p.is_dir() or p.is_symlink())
        for path in files:
            rel = _listed_as(path.relative_to(run_dir).as_posix())
            mine = (rel in exact or any(_matches(rel, p) for p in patterns)
                    or scratch and entry.name in ("last.tmp", "last.old"))
            (owned if mine else in_the_way).append(path.relative_to(run_dir).as_posix())
    return owned, in_the_way, others


def in_the_way(run_dir: Path) -> list[str]:
    """The files vaswani did not write that lie where a run writes (a resumed run's next
    checkpoint replaces ``last/`` as a whole)."""
    return survey(run_dir)[1]

# --- torchrun's restarts ---------------------------------------------------------------------

def launcher_job() -> str | None:
    """Under torchrun, the job this process belongs to, the same in each of its restarts:
    torchrun's run id (``--rdzv-id``; ``--standalone`` makes one), or, where none was given
    (``none``), this machine and the torchrun process. None when not under torchrun."""
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    if job is None:
        return None
    if job in ("", "none"):
        job = f"none@{socket.gethostname()}:{os.getppid()}"
    return job


def record_launcher(run_dir: Path) -> None:
    """Under torchrun: note in a new run's directory which job started it."""
    job = launcher_job()
    if job is not None:
        record(run_dir, LAUNCHER)
        atomic_write_text(run_dir / LAUNCHER, json.dumps({"job": job}) + "\n")


def restarted_into(run_dir: Path) -> bool:
    """Whether this process belongs to the torchrun job that started ``run_dir`` (its
    ``launcher.json``): then it is torchrun restarting that job (``--max-restarts``), or the
    same command run again with the same ``--rdzv-id``, and ``vaswani train CONFIG --out
    RUN_DIR`` continues the run instead of refusing a directory that holds one. Another job,
    or no torchrun at all: False (a run is never taken over by a command that did not start
    it). Asked by rank 0 before it writes ``launcher.json`` itself (a new run's first attempt
    finds none) and told to the others (training/train.py): torchrun's restart count cannot
    say it, as a restart made for a change of membership is not counted."""
    job = launcher_job()
    if job is None:
        return False
    try:
        recorded = json.loads((run_dir / LAUNCHER).read_text())["job"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return recorded == job


def remove_run_files(run_dir: Path) -> None:
    """Remove the files vaswani wrote in ``run_dir`` (its manifest's), then the folders of its
    names left empty, then the manifest. A file of anyone else's stays, and so does its folder."""
    owned, _, _ = survey(run_dir)
    for rel in owned:
        (run_dir / rel).unlink(missing_ok=True)
    for name in RUN_NAMES:
        top = run_dir / name
        if top.is_dir() and not top.is_symlink():
            for folder in sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only if empty
            with contextlib.suppress(OSError):
                top.rmdir()
    (run_dir / MANIFEST).unlink(missing_ok=True)


def read_metrics(path: Path) -> list[dict]:
    """The JSON objects of ``metrics.jsonl``. A line that is not one (a kill in the middle of
    writing it) is dropped with a warning that names the file and line."""
    rows = []
    if not path.exists():
        return rows
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or "step" not in row:
            warnings.warn(f"{path}:{n}: not a complete log line (a write cut short?); "
                          "dropped", stacklevel=2)
            continue
        rows.append(row)
    return rows
