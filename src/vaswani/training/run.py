"""``vaswani train``: from a config file (or a run to resume) to a trained run directory."""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import RunConfig, load_run_config
from ..data.datasets import TASKS, build_dataset
from ..data.tokenizers import load_tokenizers, save_tokenizers
from ..viz.curves import plot_loss
from . import checkpoint
from .distributed import Dist, init, shutdown
from .loop import Trainer


@dataclass(frozen=True)
class Launch:
    """Where and how this process trains (the CLI reads these from the environment)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    progress: bool = True


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device ({name!r}) asked for CUDA, but no CUDA device is available")
    return torch.device(name)


def resolve_model(cfg: RunConfig, ds) -> RunConfig:
    """Fill in what the data decides: vocabulary sizes, classes, the padding id."""
    m = cfg.model
    derived = {"vocab_size": ds.source_tokenizer.vocab_size,
               "pad_id": ds.source_tokenizer.pad_id}
    if m.arch == "encoder-decoder" and ds.target_tokenizer is not ds.source_tokenizer:
        derived["tgt_vocab_size"] = ds.target_tokenizer.vocab_size
    if m.arch == "encoder":
        derived["n_classes"] = len(ds.labels)
    for name, value in derived.items():
        given = getattr(m, name)
        if name != "pad_id" and given not in (0, None, value):
            raise ValueError(f"[model] {name} ({given}) does not match the data ({value}); "
                             "leave it out and vaswani train sets it")
    return RunConfig(m.replace(**derived), cfg.data, cfg.train, cfg.decode)


def prepare_run_dir(run_dir: Path, overwrite: bool) -> None:
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"{run_dir} already holds a run; continue it with --resume {run_dir}, "
                "choose another --out, or pass --overwrite")
        for name in ("last", "last.tmp", "last.old", "tokenizer"):
            shutil.rmtree(run_dir / name, ignore_errors=True)
        for name in ("metrics.jsonl", "model.safetensors", "config.toml", "loss.png"):
            (run_dir / name).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)


def train(config: str | None, overrides: list[str], out: str | None = None,
          resume: str | None = None, overwrite: bool = False, launch: Launch = Launch(),
          cache: Path | None = None) -> dict:
    """Train and return a summary dict (also printed by the CLI)."""
    start = time.perf_counter()
    if resume:
        run_dir = Path(resume)
        if not (run_dir / "config.toml").exists():
            raise FileNotFoundError(f"{run_dir} is not a run directory (no config.toml)")
        checkpoint.find_last(run_dir)  # fail early if there is nothing to resume
        cfg = load_run_config(run_dir / "config.toml", overrides)
    else:
        if config is None:
            raise ValueError("give a CONFIG.toml to train, or --resume RUN_DIR")
        cfg = load_run_config(config, overrides)
        run_dir = Path(out) if out else Path("runs") / Path(config).stem
        init_tokenizers = None
        if cfg.train.init_from:
            cfg, init_tokenizers = _from_pretrained(cfg)
    device = resolve_device(cfg.train.device, launch.local_rank)
    dist = init(launch.rank, launch.world, launch.local_rank, device)
    try:
        if resume:
            ds = _dataset_from_run(cfg, run_dir, cache)
        else:
            # Rank 0 trains the tokenizer and writes the run; the others then read it back.
            if dist.is_main:
                prepare_run_dir(run_dir, overwrite)
                ds = build_dataset(cfg.data, cfg.model.arch, cfg.model.max_len,
                                   init_tokenizers, cache=cache)
                _write_run(run_dir, resolve_model(cfg, ds), ds)
            dist.barrier()
            if not dist.is_main:
                ds = _dataset_from_run(cfg, run_dir, cache)
        cfg = resolve_model(cfg, ds)
        if dist.is_main:
            _announce(run_dir, cfg, ds, device, dist)
        trainer = Trainer(cfg, ds, run_dir, device=device, dist=dist, resume=bool(resume),
                          progress=launch.progress)
        result = trainer.fit()
        summary = {"run_dir": str(run_dir), "steps": trainer.step,
                   "seconds": round(time.perf_counter() - start, 1), **result}
        if dist.is_main:
            plot_loss(run_dir / "metrics.jsonl", run_dir / "loss.png")
            notes = ds.report.summary()
            if ds.truncated:
                notes += f"{'; ' if notes else ''}truncated {ds.truncated} sequence(s) " \
                         f"to max_len ({cfg.model.max_len})"
            if notes:
                summary["data_notes"] = notes
        return summary
    finally:
        shutdown(dist)


def _from_pretrained(cfg: RunConfig):
    """[train] init_from: the model and tokenizer of that run replace the config's [model]
    and tokenizer; what the new data decides (the classes) is filled in later."""
    base_dir = Path(cfg.train.init_from)
    if not (base_dir / "config.toml").exists():
        raise FileNotFoundError(f"[train] init_from ({base_dir}) is not a run directory "
                                "(no config.toml); make one with vaswani import or train")
    base = load_run_config(base_dir / "config.toml").model
    if base.arch != cfg.model.arch:
        raise ValueError(f"[train] init_from ({base_dir}) holds a {base.arch!r} model but "
                         f"[model] arch is {cfg.model.arch!r}")
    if base.arch != "encoder":
        raise ValueError("[train] init_from supports encoder models (fine-tuning a "
                         "classifier) for now")
    model = base.replace(n_classes=None, dropout=cfg.model.dropout,
                         attn_dropout=cfg.model.attn_dropout, pooling=cfg.model.pooling)
    tokenizers = load_tokenizers(base_dir / "tokenizer")
    return RunConfig(model, cfg.data, cfg.train, cfg.decode), tokenizers


def _dataset_from_run(cfg: RunConfig, run_dir: Path, cache: Path | None):
    """The dataset tokenised with the tokenizers (and labels) saved in ``run_dir``."""
    tokenizers = load_tokenizers(run_dir / "tokenizer")
    labels = json.loads((run_dir / "tokenizer" / "meta.json").read_text()).get("labels")
    return build_dataset(cfg.data, cfg.model.arch, cfg.model.max_len, tokenizers, labels,
                         cache=cache)


def _write_run(run_dir: Path, cfg: RunConfig, ds) -> None:
    """config.toml (resolved) and tokenizer/ (with the class labels, if any)."""
    target = ds.target_tokenizer if TASKS[cfg.model.arch] == "translation" else None
    save_tokenizers(run_dir / "tokenizer", ds.source_tokenizer, target)
    if ds.labels:
        meta_path = run_dir / "tokenizer" / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta["labels"] = ds.labels
        meta_path.write_text(json.dumps(meta, indent=2))
    checkpoint.atomic_write_text(run_dir / "config.toml", cfg.to_toml())


def _announce(run_dir: Path, cfg: RunConfig, ds, device: torch.device, dist: Dist) -> None:
    n_train = ds.train.numel() if isinstance(ds.train, torch.Tensor) else len(ds.train)
    n_valid = ds.valid.numel() if isinstance(ds.valid, torch.Tensor) else len(ds.valid)
    unit = "tokens" if isinstance(ds.train, torch.Tensor) else "examples"
    print(f"vaswani train: {cfg.model.arch} model, {n_train:,} training / {n_valid:,} validation "
          f"{unit}, vocabulary {cfg.model.vocab_size:,}, device {device}"
          f"{f', {dist.world} processes' if dist.enabled else ''} -> {run_dir}",
          file=sys.stderr, flush=True)
