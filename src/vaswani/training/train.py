"""``vaswani train``: from a config file (or a run to resume) to a trained run directory.

The recipe, in the order it runs (:func:`train`):

1. the config: read, ``--set`` applied, a pretrained starting point's model and tokenizer
   taken (``[train] init_from``), the schedule's length fixed (:func:`configure`);
2. the task that trains it (tasks/), the device, the processes (distributed.py);
3. the run directory, locked, and the data: encoded once into memory maps, and the config
   completed from it (vocabulary sizes, classes, padding id) (:func:`start`);
4. the training loop (loop.py ``Trainer``) until ``max_steps``, early stopping or the time
   budget, then the loss plot, the checkpoints' average and a summary.

Everything that can be checked is checked before the run directory is touched, and a start
that fails before saving any weights leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import importlib.util
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import architectures, checkpoint, devices, rundir
from ..config import DecodeConfig, RunConfig, apply_overrides, load_run_config, load_toml
from ..config.family import family
from ..data.registry import default_cache
from ..data.tokenizers import Tokenizer
from ..models import check_fits
from ..models.finetune import base_sha256
from ..tasks import Task, TaskData, task_for
from ..viz.curves import plot_loss
from .distributed import Dist, RankZeroFailed, init, rank0_decides, shutdown
from .loop import Trainer
from .parallel import parallel_class
from .progress import TENSORBOARD
from .schedules import check_schedule
from .state import StopRequest


@dataclass(frozen=True)
class Launch:
    """Where and how this process trains (the CLI reads these from the environment and
    installs the signal handlers that set ``stop``)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    progress: bool = True
    stop: StopRequest = field(default_factory=StopRequest)


Tokenizers = tuple[Tokenizer, Tokenizer | None]


def train(config: str | None, overrides: list[str], out: str | None = None,
          resume: str | None = None, overwrite: bool = False, launch: Launch | None = None,
          cache: Path | None = None) -> dict:
    """Train and return a summary dict (also printed by the CLI)."""
    launch = launch or Launch()
    began = time.perf_counter()
    cache = default_cache() if cache is None else cache
    if resume:
        run_dir, init_tokenizers = Path(resume), None
        cfg = resumed_config(run_dir, overrides, say=launch.rank == 0)
    elif config is None:
        raise ValueError("give a CONFIG.toml to train, or --resume RUN_DIR")
    else:
        run_dir = Path(out) if out else Path("runs") / Path(config).stem
        if rank0_decides("continues", lambda: str(rundir.restarted_into(run_dir)),
                         launch.rank, launch.world) == "True":  # torchrun restarting its job
            resume, overwrite = _continue_after_restart(run_dir, launch.rank)
        cfg, init_tokenizers = ((resumed_config(run_dir, overrides, say=launch.rank == 0), None)
                                if resume else configure(config, overrides, say=launch.rank == 0))
    device = devices.resolve_device(cfg.train.device, launch.local_rank,
                                    on_cpu="--set train.device=cpu")
    # config.toml says what the run trained in
    precision = devices.usable_precision(cfg.train.asked_precision, device, say=launch.rank == 0)
    cfg = cfg.replace(train=cfg.train.replace(precision=precision, bf16=precision == "bf16"))
    if cfg.train.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ImportError("[train] tensorboard = true needs TensorBoard: "  # before any file
                          "pip install 'vaswani[tensorboard]'")
    check_fits(cfg.model, device)  # a model that cannot fit, before any data is read
    task = task_for(cfg)
    if cfg.data.batch_tokens and not resume:  # a resumed run keeps the grad_accum it had
        cfg = cfg.replace(train=cfg.train.replace(
            grad_accum=accumulation(cfg, task.micro_batch_tokens(), launch.world)))
        task = task_for(cfg)
    task.check_training_config()
    dist = init(launch.rank, launch.world, launch.local_rank, device,
                group_of_one=parallel_class(cfg.train.parallel, launch.world).group_of_one,
                timeout=cfg.train.collective_timeout)
    created = not run_dir.exists()
    trainer = None
    try:
        with _lock(run_dir, dist, device):
            try:
                data, cfg = start(task, cfg, run_dir, resume=bool(resume), overwrite=overwrite,
                                  tokenizers=init_tokenizers, cache=cache, dist=dist,
                                  progress=launch.progress, device=device)
                if dist.is_main:
                    m = cfg.model
                    vocab = (f"vocabulary {m.vocab_size:,}" if m.tgt_vocab_size is None else
                             f"vocabularies {m.vocab_size:,} source / {m.tgt_vocab_size:,} target")
                    print(f"vaswani train: {m.arch} model, {len(data.train):,} "
                          f"training / {len(data.valid):,} validation {task.unit}, {vocab}, "
                          f"device {device}"
                          f"{f', {dist.world} processes' if dist.enabled else ''} -> {run_dir}",
                          file=sys.stderr, flush=True)
                    if cfg.train.tensorboard:
                        print(f"vaswani train: watch it with: tensorboard --logdir "
                              f"{run_dir / TENSORBOARD}", file=sys.stderr, flush=True)
                trainer = Trainer(cfg, task, data, run_dir, device=device, dist=dist,
                                  resume=bool(resume), progress=launch.progress,
                                  stop=launch.stop)
                result = trainer.fit()
            except (rundir.Refused, RankZeroFailed):
                raise  # nothing was touched (or rank 0 sees to it)
            except BaseException:
                if dist.is_main and not resume:
                    _clear_failed_start(run_dir, created)
                raise
            summary = {"run_dir": str(run_dir), "steps": trainer.state.step,
                       "seconds": round(time.perf_counter() - began, 1), **result}
            if trainer.state.skipped:
                summary["skipped_steps"] = trainer.state.skipped
            if dist.is_main:
                summary.update(_finish(run_dir, cfg, data))
            dist.barrier()  # see distributed.shutdown: nothing left in gloo's threads
            return summary
    finally:
        trainer = None  # the model (DDP's reducer holds the group) goes before the group:
        gc.collect()  # see distributed.shutdown
        shutdown(dist)


def _continue_after_restart(run_dir: Path, rank: int) -> tuple[str | None, bool]:
    """(resume, overwrite) for a torchrun restart into the run its job started: resume from
    the last checkpoint, or, where none was saved yet, start the run over."""
    try:
        checkpoint.find_last(run_dir)
    except FileNotFoundError:
        if rank == 0:
            print(f"vaswani train: torchrun restarted this job; {run_dir} has no checkpoint "
                  "yet: starting over", file=sys.stderr, flush=True)
        return None, True
    if rank == 0:
        count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        # a restart for a change of membership (another machine rejoining) is not counted
        print(f"vaswani train: torchrun restarted this job{f' (restart {count})' if count else ''}"
              f"; resuming {run_dir} from its last checkpoint", file=sys.stderr, flush=True)
    return str(run_dir), False


# --- 1. the config -----------------------------------------------------------------------------

def configure(config: str, overrides: list[str], say: bool = True
              ) -> tuple[RunConfig, Tokenizers | None]:
    """A new run's config (the file with ``--set`` overrides) and, with ``[train]
    init_from``, the tokenizers of the run it starts from, whose ``[model]`` replaces the
    file's (what the new data decides, the classes, is filled in later). The schedule's
    length is fixed now, so that resuming with more steps continues it. ``say``: whether
    this process prints the schedule's warnings (rank 0 of a multi-process run)."""
    cfg = load_run_config(config, overrides, fixed=architectures.fixes)
    cfg = cfg.replace(train=cfg.train.replace(schedule_steps=cfg.train.schedule_steps))
    check_schedule(cfg.train, say)
    if not cfg.train.init_from:
        return cfg, None
    base_dir = Path(cfg.train.init_from)
    if cfg.finetune.lora:  # the run reads its frozen weights there for as long as it lives
        weights = base_dir / rundir.BEST
        if not weights.exists():
            raise FileNotFoundError(f"[train] init_from ({base_dir}) has no weights "
                                    f"({rundir.BEST}) for LoRA adapters to adapt")
        cfg = cfg.replace(train=cfg.train.replace(init_from=str(base_dir.resolve())),
                          finetune=cfg.finetune.replace(base_sha256=base_sha256(weights)))
    if not (base_dir / rundir.CONFIG).exists():
        raise FileNotFoundError(f"[train] init_from ({base_dir}) is not a run directory "
                                "(no config.toml); make one with vaswani import or train")
    base = rundir.read_config(base_dir).model
    if base.arch != cfg.model.arch:
        raise ValueError(f"[train] init_from ({base_dir}) holds a {base.arch!r} model but "
                         f"[model] arch is {cfg.model.arch!r}")
    kind = family(base.arch)
    if kind.classes:  # a classifier: the body, a new head for the data's classes
        model = base.replace(n_classes=None, dropout=cfg.model.dropout,
                             attn_dropout=cfg.model.attn_dropout, pooling=cfg.model.pooling)
    elif kind.language_model:  # a language model, trained on: every weight
        model = base.replace(dropout=cfg.model.dropout, attn_dropout=cfg.model.attn_dropout)
    else:
        raise ValueError(f"[train] init_from supports encoders with a class head (fine-tuning "
                         f"a classifier) and decoder-only language models for now, not "
                         f"{kind.describes}")
    source, target, _ = rundir.read_tokenizers(base_dir)
    return cfg.replace(model=model), (source, target)


# What ``--set`` may change when a run resumes: how long it goes on, where and how it runs
# (the same arithmetic), and what it evaluates, logs, keeps and decodes. Any other setting
# would make the continued run differ from one that never stopped, and is refused by name.
RESUMABLE = {
    "train": {"max_steps", "schedule_steps", "max_minutes", "max_skipped_steps", "device",
              "compile", "parallel", "collective_timeout", "checkpoint_activations",
              "tensorboard", "log_every", "eval_every", "eval_batches", "metric_examples",
              "save_every", "keep_checkpoints", "patience"},
    "decode": {f.name for f in dataclasses.fields(DecodeConfig)},
}


def resumed_config(run_dir: Path, overrides: list[str], say: bool = True) -> RunConfig:
    """The run's config with ``--set`` overrides, which may change only what
    :data:`RESUMABLE` lists (a resumed run continues exactly: another model, seed, batching
    or optimizer would not). A run written before ``schedule_steps`` existed keeps the
    schedule its ``max_steps`` gave it. Extending a cosine schedule that has ended at a zero
    learning rate (or a wsd one) would change nothing, so it is refused. ``say``: whether
    this process prints the schedule's warnings (rank 0 of a multi-process run)."""
    if not (run_dir / rundir.CONFIG).exists():
        rundir.read_config(run_dir)  # the clear "not a run directory" error
    data = load_toml(run_dir / rundir.CONFIG)
    train_section = data.setdefault("train", {})
    train_section.setdefault("schedule_steps", train_section.get("max_steps", 1000))
    try:
        recorded = RunConfig.from_dict(copy.deepcopy(data), architectures.fixes)
        cfg = RunConfig.from_dict(apply_overrides(data, overrides), architectures.fixes)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{run_dir / rundir.CONFIG}: {e}") from None
    changed = [f"{section}.{f.name} ({getattr(getattr(recorded, section), f.name)!r} -> "
               f"{getattr(getattr(cfg, section), f.name)!r})"
               for section in ("model", "data", "train", "decode", "finetune")
               for f in dataclasses.fields(getattr(cfg, section))
               if f.name not in RESUMABLE.get(section, ()) and
               getattr(getattr(cfg, section), f.name) != getattr(getattr(recorded, section),
                                                                 f.name)]
    if changed:
        raise ValueError(f"--set would change {', '.join(changed)}, which --resume keeps as "
                         f"{run_dir / rundir.CONFIG} has them: a resumed run continues exactly "
                         "as it would have gone on. Start a new run for that (a config file; "
                         "[train] init_from starts from these weights). On resume --set may "
                         f"change {', '.join(sorted(RESUMABLE['train']))} of [train], and "
                         "[decode]")
    check_schedule(cfg.train, say)
    return cfg


def accumulation(cfg: RunConfig, micro_batch_tokens: int, world: int) -> int:
    """The micro-batches per optimizer step that ``[data] batch_tokens`` asks for, on
    ``world`` processes of ``micro_batch_tokens`` each (at least that many tokens a step)."""
    if cfg.train.grad_accum != 1:
        raise ValueError(f"[data] batch_tokens ({cfg.data.batch_tokens}) sets grad_accum; "
                         f"leave [train] grad_accum ({cfg.train.grad_accum}) out")
    return max(1, -(-cfg.data.batch_tokens // (micro_batch_tokens * world)))


def encode_data(config: str, overrides: list[str], cache: Path, *,
                progress: bool = True) -> TaskData:
    """``vaswani data encode``: the data step of ``vaswani train CONFIG`` alone, so that the
    training (and every DDP process) later maps the encoded files."""
    cfg, tokenizers = configure(config, overrides, say=False)  # the schedule: train's to say
    return task_for(cfg).load(cache, tokenizers, progress=progress)


# --- 3. the run directory and the data -------------------------------------------------------

@contextlib.contextmanager
def _lock(run_dir: Path, dist: Dist, device: torch.device):
    """Rank 0 holds the run directory's lock; every rank learns whether it got it (on the
    training device: NCCL broadcasts only CUDA tensors)."""
    with contextlib.ExitStack() as stack:
        error = None
        if dist.is_main:
            try:
                stack.enter_context(rundir.locked(run_dir))
            except (rundir.RunInUse, rundir.NotOurLock) as e:  # in use, or not vaswani's
                error = e
        failed = dist.broadcast(torch.tensor([float(error is not None)], device=device))
        if error is not None:
            raise error
        if bool(failed.item()):
            raise rundir.RunInUse(f"{run_dir} is in use by another vaswani process")
        yield


def start(task: Task, cfg: RunConfig, run_dir: Path, *, resume: bool, overwrite: bool,
          tokenizers: Tokenizers | None, cache: Path, dist: Dist, progress: bool,
          device: torch.device | None = None) -> tuple[TaskData, RunConfig]:
    """The run's data, and its config completed from the data. A new run: rank 0 trains the
    tokenizer, encodes the data (into the cache) and writes config.toml and tokenizer/; the
    other ranks then read the tokenizer back and map the same encoded files. A resumed run
    reads its tokenizer (and labels) from ``run_dir``."""
    error, data = None, None
    if dist.is_main:  # its failure reaches every rank as one error, not a hung collective
        try:
            data = _start_main(task, cfg, run_dir, resume=resume, overwrite=overwrite,
                               tokenizers=tokenizers, cache=cache, progress=progress)
        except Exception as e:  # noqa: BLE001 - raised again below, after the others hear
            error = e
    failed = dist.broadcast(torch.tensor([float(error is not None)], device=device))
    if error is not None:
        raise error
    if bool(failed.item()):
        raise RankZeroFailed(f"rank 0 could not start the run in {run_dir} (its error says "
                             "why)", quiet=True)
    dist.barrier()  # rank 0 has encoded the data (if the cache lacked it) and written the run
    if not dist.is_main:  # the others map the same files, with the tokenizer rank 0 wrote
        source, target, labels = rundir.read_tokenizers(run_dir)
        data = task.load(cache, (source, target), labels or None, progress=False)
    return data, resolve_model(cfg, task, data)


def _start_main(task: Task, cfg: RunConfig, run_dir: Path, *, resume: bool, overwrite: bool,
                tokenizers: Tokenizers | None, cache: Path, progress: bool) -> TaskData:
    """Rank 0's part of :func:`start`: the run directory, the data, config.toml."""
    labels = None
    if resume:
        checkpoint.find_last(run_dir)  # fail before reading data if there is nothing to resume
        if theirs := rundir.in_the_way(run_dir):
            raise rundir.Refused(f"{run_dir} holds {', '.join(theirs[:3])}, which vaswani did "
                                 "not write and the run's next checkpoint would replace; move "
                                 "them first")
        source, target, labels = rundir.read_tokenizers(run_dir)  # what it was trained with
        tokenizers, labels = (source, target), labels or None
    else:
        rundir.start(run_dir, overwrite)
        rundir.record_launcher(run_dir)  # a torchrun restart of this job continues the run
    data = task.load(cache, tokenizers, labels, progress=progress)
    if not resume:
        base = Path(cfg.train.init_from) if cfg.train.init_from else None
        rundir.write_run(run_dir, resolve_model(cfg, task, data), data.source_tokenizer,
                         data.target_tokenizer, data.labels,  # a chat model stays one
                         chat_template=base and rundir.read_chat_template(base))
    return data

def resolve_model(cfg: RunConfig, task: Task, data: TaskData) -> RunConfig:
    """Fill in what the data decides (vocabulary sizes, classes, the padding id)."""
    m = cfg.model
    derived = task.model_fields(data)
    for name, value in derived.items():
        given = getattr(m, name)
        if name != "pad_id" and name not in m._followed and given not in (0, None, value):
            raise ValueError(f"[model] {name} ({given}) does not match the data ({value}); "
                             "leave it out and vaswani train sets it")
    return cfg.replace(model=m.replace(**derived))


def _clear_failed_start(run_dir: Path, created: bool) -> None:
    """After a failure: a start that saved no weights leaves nothing of vaswani's behind (the
    files it wrote; and the directory, if this run created it and nothing else is in it)."""
    if not run_dir.exists() or rundir.holds_run(run_dir):
        return
    rundir.remove_run_files(run_dir)
    if created and {p.name for p in run_dir.iterdir()} <= {rundir.LOCK}:
        shutil.rmtree(run_dir, ignore_errors=True)


# --- 4. the end ----------------------------------------------------------------------------

def _finish(run_dir: Path, cfg: RunConfig, data: TaskData) -> dict:
    """Rank 0, after training: the loss plot, the kept checkpoints' average, notes on the
    data (skipped lines, truncations) for the summary."""
    out = {}
    rundir.record(run_dir, rundir.LOSS_PLOT)
    plot_loss(run_dir / rundir.METRICS, run_dir / rundir.LOSS_PLOT)
    if cfg.train.keep_checkpoints:
        path, averaged = checkpoint.write_average(run_dir)
        out["averaged"] = f"{path} ({len(averaged)} checkpoints)"
    notes = data.report.summary()
    if data.truncated:
        notes += f"{'; ' if notes else ''}truncated {data.truncated} sequence(s) to max_len " \
                 f"({cfg.model.max_len})"
    if notes:
        out["data_notes"] = notes
    return out
