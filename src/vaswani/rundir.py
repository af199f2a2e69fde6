"""Run directories: what ``vaswani train`` and ``vaswani import`` write, and what every other
command (and ``vaswani.load``) reads. This module knows the layout of ``RUN_DIR``, holds its
lock and reads and writes its description; the weights and checkpoints in it are
checkpoint.py's, and every write goes through atomic.py::

    config.toml          the fully resolved config (vocabulary sizes and labels filled in)
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

``tokenizer/meta.json`` holds the sha256 of each tokenizer file: a damaged one is an error
naming it. One process at a time: training and import hold ``RUN_DIR/.lock`` (an OS-level lock
that the kernel releases when the process ends, however it ends).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import warnings
from pathlib import Path

from .atomic import atomic_write_text
from .config import RunConfig, load_run_config
from .data.tokenizers import Tokenizer, load_tokenizers, save_tokenizers

COMPLETE, LOCK = "COMPLETE", ".lock"
CONFIG, TOKENIZER, BEST, LAST, METRICS, LOSS_PLOT = (
    "config.toml", "tokenizer", "model.safetensors", "last", "metrics.jsonl", "loss.png")
CHAT_TEMPLATE = "chat_template.jinja"  # an imported chat model's own prompt format
CHECKPOINTS, AVERAGED = "checkpoints", "averaged.safetensors"
SHARDED = "sharded"  # in last/: a sharded run's state; sharded.tmp/ in RUN_DIR while written
LAUNCHER = "launcher.json"  # under torchrun: the job that started the run (its restarts resume)
# Every name vaswani writes in a run directory (what --overwrite may remove).
RUN_FILES = (CONFIG, TOKENIZER, BEST, BEST + ".tmp", LAST, "last.tmp", "last.old", METRICS,
             LOSS_PLOT, LOSS_PLOT + ".tmp", "metrics.jsonl.tmp", "config.toml.tmp",
             CHAT_TEMPLATE, CHAT_TEMPLATE + ".tmp", CHECKPOINTS, AVERAGED, AVERAGED + ".tmp",
             SHARDED + ".tmp", LAUNCHER, LAUNCHER + ".tmp")


class RunInUse(FileExistsError):
    """Another process holds the run directory's lock."""


# --- one process per run directory -----------------------------------------------------------

@contextlib.contextmanager
def locked(run_dir: Path):
    """Hold ``run_dir/.lock`` while the block runs (creating ``run_dir`` if needed).

    The lock is ``flock``: the kernel releases it when the process exits, ``kill -9``
    included, so a stale lock file never blocks anyone; the pid written in it only lets the
    next process say whose lock it took over."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        previous = os.read(fd, 32).decode(errors="replace").strip()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunInUse(f"{run_dir} is in use by another vaswani process (pid "
                           f"{previous or '?'}); wait for it to finish, or stop it") from None
        if previous and previous != str(os.getpid()):
            print(f"vaswani: {run_dir} was left locked by process {previous}, which is no "
                  "longer running; taking over", file=sys.stderr, flush=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # a clean exit leaves no pid behind
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# --- the run's description: config and tokenizers -------------------------------------------

def write_run(run_dir: Path, config: RunConfig, source: Tokenizer, target: Tokenizer | None,
              labels: list[str], *, header: str = "", chat_template: str | None = None) -> None:
    """``config.toml`` (resolved, written last), ``tokenizer/`` (with the class labels, if
    any) and an imported chat model's ``chat_template.jinja``."""
    save_tokenizers(run_dir / TOKENIZER, source, target)
    if chat_template:
        atomic_write_text(run_dir / CHAT_TEMPLATE, chat_template)
    if labels:
        meta_path = run_dir / TOKENIZER / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta["labels"] = labels
        atomic_write_text(meta_path, json.dumps(meta, indent=2))
    atomic_write_text(run_dir / CONFIG, header + config.to_toml())


def read_config(run_dir: Path, overrides: list[str] = ()) -> RunConfig:
    """The run's config (with ``--set`` overrides); a missing one is a clear error."""
    if not (run_dir / CONFIG).exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {CONFIG}); train one "
                                "with `vaswani train CONFIG.toml --out RUN_DIR`")
    return load_run_config(run_dir / CONFIG, overrides)


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

    A run is refused unless ``overwrite``; other files too (they are not vaswani's). What a
    start left without saving any weights (killed during start-up, or an error before the
    first checkpoint) is cleared with a message. ``overwrite`` removes only ``RUN_FILES``."""
    others = [p.name for p in run_dir.iterdir() if p.name != LOCK] if run_dir.exists() else []
    if holds_run(run_dir) and not overwrite:
        raise FileExistsError(
            f"{run_dir} already holds a run; continue it with --resume {run_dir}, "
            "choose another --out, or pass --overwrite")
    foreign = [name for name in others if name not in RUN_FILES]
    if foreign and not overwrite:
        raise FileExistsError(f"{run_dir} is not empty ({', '.join(sorted(foreign)[:3])}"
                              f"{' ...' if len(foreign) > 3 else ''}); choose another --out, "
                              "or pass --overwrite (which removes only vaswani's files)")
    if others and not overwrite:
        print(f"vaswani: {run_dir} holds the start of a run that saved no weights; starting "
              "over", file=sys.stderr, flush=True)
    remove_run_files(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)


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
    """Remove what vaswani writes in ``run_dir`` (``RUN_FILES``), nothing else."""
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


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
