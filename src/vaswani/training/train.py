"""``vaswani train``: from a config file (or a run to resume) to a trained run directory."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import rundir
from ..config import RunConfig, load_run_config
from ..data.registry import default_cache
from ..tasks import Task, TaskData, task_for
from ..viz.curves import plot_loss
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


def resolve_model(cfg: RunConfig, task: Task, data: TaskData) -> RunConfig:
    """Fill in what the data decides (vocabulary sizes, classes, the padding id)."""
    m = cfg.model
    derived = task.model_fields(data)
    for name, value in derived.items():
        given = getattr(m, name)
        if name != "pad_id" and name not in m._followed and given not in (0, None, value):
            raise ValueError(f"[model] {name} ({given}) does not match the data ({value}); "
                             "leave it out and vaswani train sets it")
    return RunConfig(m.replace(**derived), cfg.data, cfg.train, cfg.decode)


def train(config: str | None, overrides: list[str], out: str | None = None,
          resume: str | None = None, overwrite: bool = False, launch: Launch = Launch(),
          cache: Path | None = None) -> dict:
    """Train and return a summary dict (also printed by the CLI)."""
    start = time.perf_counter()
    cache = default_cache() if cache is None else cache
    init_tokenizers = None
    if resume:
        run_dir = Path(resume)
        cfg = rundir.read_config(run_dir, overrides)
        rundir.find_last(run_dir)  # fail early if there is nothing to resume
    else:
        if config is None:
            raise ValueError("give a CONFIG.toml to train, or --resume RUN_DIR")
        cfg = load_run_config(config, overrides)
        run_dir = Path(out) if out else Path("runs") / Path(config).stem
        if cfg.train.init_from:
            cfg, init_tokenizers = _from_pretrained(cfg)
    device = resolve_device(cfg.train.device, launch.local_rank)
    dist = init(launch.rank, launch.world, launch.local_rank, device)
    task = task_for(cfg)
    try:
        if resume:
            data = _data_from_run(task, run_dir, cache)
        else:
            # Rank 0 trains the tokenizer and writes the run; the others then read it back.
            if dist.is_main:
                rundir.start(run_dir, overwrite)
                data = task.load(cache, init_tokenizers)
                rundir.write_run(run_dir, resolve_model(cfg, task, data), data.source_tokenizer,
                                 data.target_tokenizer, data.labels)
            dist.barrier()
            if not dist.is_main:
                data = _data_from_run(task, run_dir, cache)
        cfg = resolve_model(cfg, task, data)
        if dist.is_main:
            _announce(run_dir, cfg, task, data, device, dist)
        trainer = Trainer(cfg, data, run_dir, device=device, dist=dist, resume=bool(resume),
                          progress=launch.progress)
        result = trainer.fit()
        summary = {"run_dir": str(run_dir), "steps": trainer.step,
                   "seconds": round(time.perf_counter() - start, 1), **result}
        if dist.is_main:
            plot_loss(run_dir / rundir.METRICS, run_dir / rundir.LOSS_PLOT)
            notes = data.report.summary()
            if data.truncated:
                notes += f"{'; ' if notes else ''}truncated {data.truncated} sequence(s) " \
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
    if not (base_dir / rundir.CONFIG).exists():
        raise FileNotFoundError(f"[train] init_from ({base_dir}) is not a run directory "
                                "(no config.toml); make one with vaswani import or train")
    base = rundir.read_config(base_dir).model
    if base.arch != cfg.model.arch:
        raise ValueError(f"[train] init_from ({base_dir}) holds a {base.arch!r} model but "
                         f"[model] arch is {cfg.model.arch!r}")
    if base.arch != "encoder":
        raise ValueError("[train] init_from supports encoder models (fine-tuning a "
                         "classifier) for now")
    model = base.replace(n_classes=None, dropout=cfg.model.dropout,
                         attn_dropout=cfg.model.attn_dropout, pooling=cfg.model.pooling)
    source, target, _ = rundir.read_tokenizers(base_dir)
    return RunConfig(model, cfg.data, cfg.train, cfg.decode), (source, target)


def _data_from_run(task: Task, run_dir: Path, cache: Path) -> TaskData:
    """The data encoded with the tokenizers (and labels) saved in ``run_dir``."""
    source, target, labels = rundir.read_tokenizers(run_dir)
    return task.load(cache, (source, target), labels)


def _announce(run_dir: Path, cfg: RunConfig, task: Task, data: TaskData, device: torch.device,
              dist: Dist) -> None:
    n_train, n_valid = len(data.train), len(data.valid)
    print(f"vaswani train: {cfg.model.arch} model, {n_train:,} training / {n_valid:,} "
          f"validation {task.unit}, vocabulary {cfg.model.vocab_size:,}, device {device}"
          f"{f', {dist.world} processes' if dist.enabled else ''} -> {run_dir}",
          file=sys.stderr, flush=True)
