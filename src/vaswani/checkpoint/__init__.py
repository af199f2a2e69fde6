"""Weights and checkpoints in a run directory (layout: rundir/): safetensors with their own
checksums, the ``last/`` state that resumes a run exactly, the kept checkpoints and their
average.

Damage is detected, not loaded: every weights file carries the sha256 of its tensors in its own
header and ``last/state.json`` that of ``trainer.pt``; a mismatch (a bit flip, a partial copy)
is an error naming the file. Nothing is unpickled: weights are safetensors, ``trainer.pt`` is
read with ``torch.load(weights_only=True)``.

``last/`` is replaced as a whole: the new state is written to ``last.tmp/`` and swapped in by
two renames; :func:`find_last` also finds a complete ``last.tmp/`` or ``last.old/`` if a kill
fell between them.

A weights file itself (its checksum, its writing, its reading tensor by tensor) is
files.py's; quantized.py reads one into int8 or int4 layers.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from ..atomic import atomic_write, atomic_write_text, file_sha256, fsync_dir
from ..models.common import assign
from ..models.finetune import base_names, saved_names
from ..rundir import AVERAGED, BEST, CHECKPOINTS, COMPLETE, LAST, SHARDED, record
from .files import RowBlocks as RowBlocks
from .files import iter_weights, read_weights, write_tensors
from .files import tensors_sha256 as tensors_sha256

WEIGHTS = ("best", "last", "averaged")


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
    """State dict with each shared (tied) tensor stored once, under its first name (a model
    with LoRA adapters: its trainable parameters only, models/finetune.py)."""
    seen: dict[int, str] = {}
    out = {}
    kept = saved_names(unwrap(model))
    for name, t in unwrap(model).state_dict().items():
        key = t.untyped_storage().data_ptr()
        if key in seen or (kept is not None and name not in kept):
            continue
        seen[key] = name
        out[name] = t.detach().contiguous().cpu()
    return out


Weights = nn.Module | dict[str, torch.Tensor]  # a model, or its tensors (model_tensors)


def as_tensors(weights: Weights) -> dict[str, torch.Tensor]:
    return weights if isinstance(weights, dict) else model_tensors(weights)


def save_best(run_dir: Path, weights: Weights, metadata: dict[str, str] | None = None) -> None:
    """The run's best weights, ``model.safetensors``."""
    record(run_dir, BEST)
    save_weights(weights, run_dir / BEST, metadata)


def save_weights(weights: Weights, path: Path, metadata: dict[str, str] | None = None) -> None:
    write_tensors(path, as_tensors(weights), metadata)


def load_weights(model: nn.Module, path: Path, *, fresh: tuple[str, ...] = (),
                 frozen: bool = False) -> None:
    """Load safetensors weights, one tensor at a time; names from compiled models
    (``_orig_mod.``) are accepted and tied weights that were stored once are restored to every
    name. Parameters whose names start with one of ``fresh`` are not loaded and keep their
    initial values (a new head). A sharded (FSDP) model takes each rank's slices. A model
    with LoRA adapters takes its trainable parameters from ``path``, or with ``frozen`` every
    other weight, from its base run's weights (models/finetune.py ``base_names``)."""
    load_tensors(model, iter_weights(path), path, fresh=fresh, frozen=frozen)


def load_tensors(model: nn.Module,
                 tensors: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                 where: Path | str, *, fresh: tuple[str, ...] = (),
                 frozen: bool = False) -> None:
    """:func:`load_weights` of tensors in memory, or of (name, tensor) pairs as they are read
    (``where`` names them in errors)."""
    state = unwrap(model).state_dict(keep_vars=True)  # tied names hold the same tensor
    if frozen:  # an adapted model's frozen weights, under their base run's names
        slots = {plain: state[name] for name, plain in base_names(unwrap(model)).items()}
    else:
        kept = saved_names(unwrap(model))  # adapters: the trainable parameters only
        slots = {k: v for k, v in state.items() if kept is None or k in kept}
    loaded: set[int] = set()
    wrong, unexpected = [], []
    with torch.no_grad():
        for name, value in tensors.items() if isinstance(tensors, dict) else tensors:
            name = name.replace("_orig_mod.", "")
            slot = slots.get(name)
            if fresh and name.startswith(fresh):
                continue
            if slot is None:
                unexpected.append(name)
            elif value.shape != slot.shape:
                wrong.append(f"{name} {tuple(value.shape)} (the model's: {tuple(slot.shape)})")
            else:
                assign(slot, value)
                loaded.add(id(slot))
    if wrong:
        raise ValueError(f"{where} does not match the model built from the config: "
                         f"{'; '.join(wrong[:3])}{' ...' if len(wrong) > 3 else ''} (was "
                         "config.toml edited?)")
    missing = [name for name, slot in slots.items()
               if id(slot) not in loaded and not (fresh and name.startswith(fresh))]
    if missing or unexpected:
        raise ValueError(f"{where} does not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")


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


# --- last/: the state a run resumes from ------------------------------------------------------

def save_last(run_dir: Path, weights: Weights, trainer_state: dict, state: dict, *,
              sharded: Path | None = None) -> None:
    """Write ``last/`` as a whole: build ``last.tmp/``, then swap it in. If a write fails,
    ``last.tmp/`` is removed and ``last/`` is left as it was. ``sharded``: a folder of
    sharded state (training/sharding.py), written beside, moved in as ``last/sharded/``."""
    tmp, last, old = run_dir / "last.tmp", run_dir / LAST, run_dir / "last.old"
    record(run_dir, *(f"{LAST}/{name}" for name in (BEST, "trainer.pt", "state.json", COMPLETE)),
           *([f"{LAST}/{SHARDED}/*"] if sharded is not None else []))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if sharded is not None:
            os.replace(sharded, tmp / SHARDED)
        save_weights(weights, tmp / BEST)
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
    fsync_dir(run_dir)
    shutil.rmtree(old, ignore_errors=True)


def find_last(run_dir: Path) -> Path:
    """The newest complete ``last`` directory, surviving a kill in the middle of a swap (a
    complete ``last.tmp/`` is newer than ``last/``, which is newer than ``last.old/``)."""
    for name in ("last.tmp", LAST, "last.old"):
        candidate = run_dir / name
        if (candidate / COMPLETE).exists():
            return candidate
    raise FileNotFoundError(f"{run_dir} has no complete checkpoint (last/) to resume from")


def load_last(run_dir: Path, model: nn.Module) -> tuple[dict, dict]:
    """Load ``last`` weights into ``model``; return (trainer_state, state)."""
    load_weights(model, find_last(run_dir) / BEST)
    return read_last(run_dir)


def read_last(run_dir: Path) -> tuple[dict, dict]:
    """``last``'s (trainer_state, state), checked against the checksum written with them."""
    last = find_last(run_dir)
    state = json.loads((last / "state.json").read_text())
    recorded = state.get("trainer_sha256")
    if recorded is not None and file_sha256(last / "trainer.pt") != recorded:
        raise ValueError(f"{last / 'trainer.pt'} is damaged: it does not match the checksum "
                         "written with it; the run cannot be resumed exactly from it")
    trainer_state = torch.load(last / "trainer.pt", weights_only=True)
    return trainer_state, state


# --- kept checkpoints and their average -------------------------------------------------------

def save_checkpoint(run_dir: Path, weights: Weights, step: int, keep: int) -> None:
    """Keep this step's weights in ``checkpoints/`` and delete all but the newest ``keep``
    (disk stays bounded at ``keep`` copies of the weights)."""
    folder = run_dir / CHECKPOINTS
    name = f"step-{step:06d}.safetensors"
    record(run_dir, f"{CHECKPOINTS}/{name}")
    folder.mkdir(exist_ok=True)
    save_weights(weights, folder / name, {"step": str(step)})
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink()


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The kept checkpoints, oldest first."""
    folder = run_dir / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(folder.glob("step-*.safetensors"), key=lambda p: int(p.stem.split("-")[1]))


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
            if name in dtypes and t.dtype != dtypes[name]:
                raise ValueError(f"{path}: {name} is {str(t.dtype).removeprefix('torch.')}, "
                                 f"but {str(dtypes[name]).removeprefix('torch.')} in "
                                 f"{paths[0]}: average checkpoints of one precision")
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
    out = run_dir / AVERAGED
    record(run_dir, AVERAGED)
    write_tensors(out, average_checkpoints(paths), {"averaged": ",".join(p.stem for p in paths)})
    return out, paths
