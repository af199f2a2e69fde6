"""Run directories: what ``vaswani train`` and ``vaswani import`` write, and what every other
command (and ``vaswani.load``) reads. The only module that knows the layout of ``RUN_DIR``::

    config.toml          the fully resolved config (vocabulary sizes and labels filled in)
    tokenizer/           meta.json + the tokenizer file(s)
    model.safetensors    the best weights so far (by [train] best_metric)
    last/                the latest state, enough to resume exactly:
        model.safetensors
        trainer.pt       optimizer, scheduler and RNG state (tensors and numbers only)
        state.json       step, batches consumed, best metric, data fingerprint
    checkpoints/         with [train] keep_checkpoints = N: the weights of the last N
        step-000500.safetensors ...   checkpoints (one per save_every steps)
    averaged.safetensors their average (`vaswani average`, and at the end of training)
    metrics.jsonl        one JSON object per log line
    loss.png             the loss curves, drawn when training ends

Every file is written to a temporary name, fsync'ed and renamed over the old one, so a kill at
any moment leaves the previous version readable. ``last/`` is replaced as a whole: the new
state is written to ``last.tmp/`` and swapped in by two renames; ``load_last`` also finds a
complete ``last.tmp/`` or ``last.old/`` if a kill fell between them. Nothing is unpickled:
weights are safetensors, ``trainer.pt`` is read with ``torch.load(weights_only=True)``.

Damage is detected, not loaded: every weights file carries the sha256 of its tensors in its
own header, ``tokenizer/meta.json`` the sha256 of each tokenizer file and ``last/state.json``
that of ``trainer.pt``; a mismatch (a bit flip, a partial copy) is an error naming the file.
A failed write (a full disk) is an error that says so, and the previous version stays.

One process at a time: training and import hold ``RUN_DIR/.lock`` (an OS-level lock that the
kernel releases when the process ends, however it ends).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from .config import RunConfig, load_run_config
from .data.tokenizers import Tokenizer, load_tokenizers, save_tokenizers

COMPLETE, LOCK = "COMPLETE", ".lock"
CONFIG, TOKENIZER, BEST, LAST, METRICS, LOSS_PLOT = (
    "config.toml", "tokenizer", "model.safetensors", "last", "metrics.jsonl", "loss.png")
CHAT_TEMPLATE = "chat_template.jinja"  # an imported chat model's own prompt format
CHECKPOINTS, AVERAGED = "checkpoints", "averaged.safetensors"
# Every name vaswani writes in a run directory (what --overwrite may remove).
RUN_FILES = (CONFIG, TOKENIZER, BEST, BEST + ".tmp", LAST, "last.tmp", "last.old", METRICS,
             LOSS_PLOT, LOSS_PLOT + ".tmp", "metrics.jsonl.tmp", "config.toml.tmp",
             CHAT_TEMPLATE, CHAT_TEMPLATE + ".tmp", CHECKPOINTS, AVERAGED, AVERAGED + ".tmp")


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


def append_metrics(path: Path, row: dict) -> None:
    """Add one log line, flushed to disk (a kill cuts at most this line short)."""
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


WEIGHTS = ("best", "last", "averaged")


def weights_path(run_dir: Path, which: str = "best") -> Path:
    """``"best"``: model.safetensors (the latest checkpoint's when no best exists yet);
    ``"last"``: the latest checkpoint's; ``"averaged"``: averaged.safetensors."""
    if which == "best" and (run_dir / BEST).exists():
        return run_dir / BEST
    if which in ("best", "last"):
        return find_last(run_dir) / BEST
    if which == "averaged":
        if not (run_dir / AVERAGED).exists():
            raise FileNotFoundError(f"{run_dir} has no {AVERAGED}: train with [train] "
                                    "keep_checkpoints = N, then `vaswani average "
                                    f"{run_dir}`")
        return run_dir / AVERAGED
    raise ValueError(f"weights ({which!r}) must be one of {', '.join(WEIGHTS)}")


# --- crash-safe writes -----------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteError(OSError):
    """A file could not be written; the previous version of it is intact."""


def atomic_write(path: Path, write) -> None:
    """Call ``write(tmp_path)``, fsync the result and rename it to ``path``. If anything
    fails, the temporary file is removed, ``path`` is untouched, and the error says why."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    except Exception as e:  # OSError, and torch's and safetensors' own error types
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(path, e) from e
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_error(path: Path, cause: BaseException) -> WriteError:
    """A one-line :class:`WriteError` for ``path``, saying when the disk is full."""
    reason = str(cause).strip().splitlines()[0][:160] if str(cause).strip() else type(cause)
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    full = getattr(cause, "errno", None) == errno.ENOSPC or "space" in str(cause).lower() or (
        free is not None and free < 1 << 20)
    hint = (f"; the disk is full ({(free or 0) >> 20} MiB free)" if full else "")
    return WriteError(f"could not write {path} ({reason}){hint}; the previous version of "
                      "the file, if any, is intact")


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DDP and/or torch.compile wrappers."""
    while True:
        if hasattr(model, "module"):  # DistributedDataParallel
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile
            model = model._orig_mod
        else:
            return model


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """State dict with each shared (tied) tensor stored once, under its first name."""
    seen: dict[int, str] = {}
    out = {}
    for name, t in unwrap(model).state_dict().items():
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen[key] = name
        out[name] = t.detach().contiguous().cpu()
    return out


# --- weights and checkpoints -----------------------------------------------------------------

def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the tensors' names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_weights(model: nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    """Safetensors, with the sha256 of the tensors in the file's own metadata."""
    tensors = model_tensors(model)
    metadata = {**(metadata or {}), "sha256": tensors_sha256(tensors)}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file, checked against the sha256 it was written with (files
    written before checksums existed are read unchecked)."""
    if not path.exists():
        raise FileNotFoundError(f"no weights at {path}")
    try:
        with safe_open(str(path), "pt") as f:
            recorded = (f.metadata() or {}).get("sha256")
        tensors = load_file(str(path))
    except Exception as e:  # safetensors' own error types: a truncated or garbled file
        raise ValueError(f"{path} is damaged or not a safetensors file ({str(e)[:120]}); "
                         "restore it, or load the other weights (best or last)") from None
    if recorded is not None and tensors_sha256(tensors) != recorded:
        raise ValueError(f"{path} is damaged: its tensors do not match the checksum written "
                         "with them (a bit flip or a partial copy); restore it, or load the "
                         "other weights (best or last)")
    return tensors


def load_weights(model: nn.Module, path: Path, *, fresh: tuple[str, ...] = ()) -> None:
    """Load safetensors weights; names from compiled models (``_orig_mod.``) are accepted and
    tied weights that were stored once are restored to every name. Parameters whose names
    start with one of ``fresh`` are not loaded and keep their initial values (a new head)."""
    tensors = {k.replace("_orig_mod.", ""): v for k, v in read_weights(path).items()}
    if fresh:
        tensors = {k: v for k, v in tensors.items() if not k.startswith(fresh)}
    target = unwrap(model)
    expected = target.state_dict()
    wrong = [f"{k} {tuple(v.shape)} (the model's: {tuple(expected[k].shape)})"
             for k, v in tensors.items() if k in expected and v.shape != expected[k].shape]
    if wrong:
        raise ValueError(f"{path} does not match the model built from the config: "
                         f"{'; '.join(wrong[:3])}{' ...' if len(wrong) > 3 else ''} (was "
                         "config.toml edited?)")
    missing, unexpected = target.load_state_dict(tensors, strict=False)
    tied = {name for name in missing if _is_tied(target, name, tensors)}
    missing = [m for m in missing if m not in tied and not (fresh and m.startswith(fresh))]
    if missing or unexpected:
        raise ValueError(f"{path} does not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")


def _is_tied(model: nn.Module, name: str, stored: dict) -> bool:
    state = model.state_dict()
    ptr = state[name].untyped_storage().data_ptr()
    return any(state[k].untyped_storage().data_ptr() == ptr for k in stored if k in state)


def save_last(run_dir: Path, model: nn.Module, trainer_state: dict, state: dict) -> None:
    """Write ``last/`` as a whole: build ``last.tmp/``, then swap it in. If a write fails,
    ``last.tmp/`` is removed and ``last/`` is left as it was."""
    tmp, last, old = run_dir / "last.tmp", run_dir / "last", run_dir / "last.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_weights(model, tmp / BEST)
        atomic_write(tmp / "trainer.pt", lambda p: torch.save(trainer_state, p))
        state = {**state, "trainer_sha256": file_sha256(tmp / "trainer.pt")}
        atomic_write_text(tmp / "state.json", json.dumps(state, indent=2))
        atomic_write_text(tmp / COMPLETE, "")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    if last.exists():
        os.replace(last, old)
    os.replace(tmp, last)
    _fsync_dir(run_dir)
    shutil.rmtree(old, ignore_errors=True)


# --- checkpoint averaging ----------------------------------------------------------------------

def save_checkpoint(run_dir: Path, model: nn.Module, step: int, keep: int) -> None:
    """Keep this step's weights in ``checkpoints/`` and delete all but the newest ``keep``
    (disk stays bounded at ``keep`` copies of the weights)."""
    folder = run_dir / CHECKPOINTS
    folder.mkdir(exist_ok=True)
    save_weights(model, folder / f"step-{step:06d}.safetensors", {"step": str(step)})
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink()


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The kept checkpoints, oldest first."""
    folder = run_dir / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(folder.glob("step-*.safetensors"),
                  key=lambda p: int(p.stem.split("-")[1]))


def average_checkpoints(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the checkpoints' tensors, summed in float64 and cast back to
    each tensor's dtype (so averaging N copies of one checkpoint gives that checkpoint)."""
    if not paths:
        raise ValueError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        tensors = read_weights(path)
        if total and tensors.keys() != total.keys():
            raise ValueError(f"{path} holds other tensors than {paths[0]}: the checkpoints "
                             "are not of one model")
        for name, t in tensors.items():
            if name in total and t.shape != total[name].shape:
                raise ValueError(f"{path}: {name} has shape {tuple(t.shape)}, not "
                                 f"{tuple(total[name].shape)} as in {paths[0]}")
            total[name] = total.get(name, 0) + t.double()
            dtypes[name] = t.dtype
    return {name: (t / len(paths)).to(dtypes[name]) for name, t in total.items()}


def write_average(run_dir: Path, last: int = 0) -> tuple[Path, list[Path]]:
    """Average the newest ``last`` kept checkpoints (0 = all) into averaged.safetensors;
    returns its path and the checkpoints averaged."""
    paths = list_checkpoints(run_dir)
    if not paths:
        raise FileNotFoundError(f"{run_dir / CHECKPOINTS} holds no checkpoints; train with "
                                "[train] keep_checkpoints = N (e.g. --set "
                                "train.keep_checkpoints=5) to keep the last N")
    if last < 0:
        raise ValueError(f"--last ({last}) must be >= 0")
    if last:
        if last > len(paths):
            raise ValueError(f"--last {last}: {run_dir / CHECKPOINTS} holds only "
                             f"{len(paths)} checkpoints")
        paths = paths[-last:]
    tensors = average_checkpoints(paths)
    metadata = {"sha256": tensors_sha256(tensors),
                "averaged": ",".join(p.stem for p in paths)}
    out = run_dir / AVERAGED
    atomic_write(out, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    return out, paths


def find_last(run_dir: Path) -> Path:
    """The newest complete ``last`` directory, surviving a kill in the middle of a swap (a
    complete ``last.tmp/`` is newer than ``last/``, which is newer than ``last.old/``)."""
    for name in ("last.tmp", "last", "last.old"):
        candidate = run_dir / name
        if (candidate / COMPLETE).exists():
            return candidate
    raise FileNotFoundError(f"{run_dir} has no complete checkpoint (last/) to resume from")


def load_last(run_dir: Path, model: nn.Module) -> tuple[dict, dict]:
    """Load ``last`` weights into ``model``; return (trainer_state, state)."""
    last = find_last(run_dir)
    load_weights(model, last / BEST)
    state = json.loads((last / "state.json").read_text())
    recorded = state.get("trainer_sha256")
    if recorded is not None and file_sha256(last / "trainer.pt") != recorded:
        raise ValueError(f"{last / 'trainer.pt'} is damaged: it does not match the checksum "
                         "written with it; the run cannot be resumed exactly from it")
    trainer_state = torch.load(last / "trainer.pt", weights_only=True)
    return trainer_state, state
