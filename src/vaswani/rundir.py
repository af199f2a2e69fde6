"""Run directories: what ``vaswani train`` and ``vaswani import`` write, and what every other
command (and ``vaswani.load``) reads. The only module that knows the layout of ``RUN_DIR``::

    config.toml          the fully resolved config (vocabulary sizes and labels filled in)
    tokenizer/           meta.json + the tokenizer file(s)
    model.safetensors    the best weights so far (by [train] best_metric)
    last/                the latest state, enough to resume exactly:
        model.safetensors
        trainer.pt       optimizer, scheduler and RNG state (tensors and numbers only)
        state.json       step, batches consumed, best metric, data fingerprint
    metrics.jsonl        one JSON object per log line
    loss.png             the loss curves, drawn when training ends

Every file is written to a temporary name, fsync'ed and renamed over the old one, so a kill at
any moment leaves the previous version readable. ``last/`` is replaced as a whole: the new
state is written to ``last.tmp/`` and swapped in by two renames; ``load_last`` also finds a
complete ``last.tmp/`` or ``last.old/`` if a kill fell between them. Nothing is unpickled:
weights are safetensors, ``trainer.pt`` is read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .config import RunConfig, load_run_config
from .data.tokenizers import Tokenizer, load_tokenizers, save_tokenizers

COMPLETE = "COMPLETE"
CONFIG, TOKENIZER, BEST, LAST, METRICS, LOSS_PLOT = (
    "config.toml", "tokenizer", "model.safetensors", "last", "metrics.jsonl", "loss.png")
# Every name vaswani writes in a run directory (what --overwrite may remove).
RUN_FILES = (CONFIG, TOKENIZER, BEST, LAST, "last.tmp", "last.old", METRICS, LOSS_PLOT)


# --- the run's description: config and tokenizers -------------------------------------------

def write_run(run_dir: Path, config: RunConfig, source: Tokenizer, target: Tokenizer | None,
              labels: list[str], *, header: str = "") -> None:
    """``config.toml`` (resolved) and ``tokenizer/`` (with the class labels, if any)."""
    save_tokenizers(run_dir / TOKENIZER, source, target)
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


def start(run_dir: Path, overwrite: bool) -> None:
    """Make ``run_dir`` ready for a new run: refused if it holds one, unless ``overwrite``,
    which removes only the files a run writes (``RUN_FILES``)."""
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"{run_dir} already holds a run; continue it with --resume {run_dir}, "
                "choose another --out, or pass --overwrite")
        for name in RUN_FILES:
            path = run_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)


def weights_path(run_dir: Path, which: str = "best") -> Path:
    """``"best"``: model.safetensors (the latest checkpoint's when no best exists yet);
    ``"last"``: the latest checkpoint's."""
    if which == "best" and (run_dir / BEST).exists():
        return run_dir / BEST
    if which in ("best", "last"):
        return find_last(run_dir) / BEST
    raise ValueError(f"weights ({which!r}) must be 'best' or 'last'")


# --- crash-safe writes -----------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write) -> None:
    """Call ``write(tmp_path)``, fsync the result and rename it to ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


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

def save_weights(model: nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    atomic_write(path, lambda tmp: save_file(model_tensors(model), str(tmp), metadata=metadata))


def load_weights(model: nn.Module, path: Path, *, fresh: tuple[str, ...] = ()) -> None:
    """Load safetensors weights; names from compiled models (``_orig_mod.``) are accepted and
    tied weights that were stored once are restored to every name. Parameters whose names
    start with one of ``fresh`` are not loaded and keep their initial values (a new head)."""
    if not path.exists():
        raise FileNotFoundError(f"no weights at {path}")
    tensors = {k.replace("_orig_mod.", ""): v for k, v in load_file(str(path)).items()}
    if fresh:
        tensors = {k: v for k, v in tensors.items() if not k.startswith(fresh)}
    target = unwrap(model)
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
    """Write ``last/`` as a whole: build ``last.tmp/``, then swap it in."""
    tmp, last, old = run_dir / "last.tmp", run_dir / "last", run_dir / "last.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_weights(model, tmp / "model.safetensors")
    atomic_write(tmp / "trainer.pt", lambda p: torch.save(trainer_state, p))
    atomic_write_text(tmp / "state.json", json.dumps(state, indent=2))
    atomic_write_text(tmp / COMPLETE, "")
    shutil.rmtree(old, ignore_errors=True)
    if last.exists():
        os.replace(last, old)
    os.replace(tmp, last)
    _fsync_dir(run_dir)
    shutil.rmtree(old, ignore_errors=True)


def find_last(run_dir: Path) -> Path:
    """The newest complete ``last`` directory, surviving a kill in the middle of a swap."""
    for name in ("last", "last.tmp", "last.old"):
        candidate = run_dir / name
        if (candidate / COMPLETE).exists():
            return candidate
    raise FileNotFoundError(f"{run_dir} has no complete checkpoint (last/) to resume from")


def load_last(run_dir: Path, model: nn.Module) -> tuple[dict, dict]:
    """Load ``last`` weights into ``model``; return (trainer_state, state)."""
    last = find_last(run_dir)
    load_weights(model, last / "model.safetensors")
    trainer_state = torch.load(last / "trainer.pt", weights_only=True)
    state = json.loads((last / "state.json").read_text())
    return trainer_state, state
