"""``vaswani train``, ``vaswani summary``, ``vaswani average``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from .common import cache_dir

TRAIN_HELP = """\
Train a model on the [data] of CONFIG.toml and write a run directory:

  RUN_DIR/config.toml        the fully resolved config
  RUN_DIR/tokenizer/         the tokenizer(s), and class labels
  RUN_DIR/model.safetensors  the best weights by [train] best_metric
  RUN_DIR/last/              everything needed to resume exactly (--resume)
  RUN_DIR/metrics.jsonl      one JSON object per log line; RUN_DIR/loss.png at the end

Interrupt with Ctrl-C (or SIGTERM) at any time: the current step finishes, the state is saved,
and --resume continues exactly (a second Ctrl-C stops at once, keeping the last checkpoint).
One process per RUN_DIR: a second one is refused while the first runs. Multi-process:
  torchrun --nproc_per_node=2 -m vaswani train CONFIG.toml
"""


def add_commands(sub, cache: argparse.ArgumentParser) -> None:
    p = sub.add_parser("summary", help="count the parameters of a config's or a run's model",
                       description="Build the [model] of CONFIG.toml (or of RUN_DIR) and "
                                   "print parameter counts.")
    p.add_argument("config", metavar="CONFIG.toml|RUN_DIR",
                   help="a config file, or a run directory (its config.toml)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set model.vocab_size=8000")
    p.set_defaults(func=summary)

    p = sub.add_parser("train", help="train a model from a config file", parents=[cache],
                       description=TRAIN_HELP, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("config", nargs="?", metavar="CONFIG.toml",
                   help="config with [model], [data], [train], [decode] sections")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set train.lr=3e-4 (repeatable)")
    p.add_argument("--out", metavar="RUN_DIR", help="run directory (default runs/<config name>)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue this run exactly where it stopped;\n"
                   "to train longer: --set train.max_steps=N, and with a\n"
                   "cosine or wsd schedule --set train.schedule_steps=N\n"
                   "to stretch it over the new steps")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in RUN_DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=train)

    p = sub.add_parser("average", help="average a run's last checkpoints (as the paper does)",
                       description="Average the weights of the last N checkpoints kept in "
                                   "RUN_DIR/checkpoints/ (train with [train] keep_checkpoints "
                                   "= N) into RUN_DIR/averaged.safetensors; use them with "
                                   "--weights averaged.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by vaswani train")
    p.add_argument("--last", type=int, default=0, metavar="N",
                   help="average the newest N checkpoints (default: every kept one)")
    p.set_defaults(func=average)


def train(args: argparse.Namespace) -> int:
    from ..training.distributed import die_with_launcher
    from ..training.state import StopRequest
    from ..training.train import Launch, train

    if args.config and args.resume:
        raise ValueError("give either CONFIG.toml or --resume RUN_DIR, not both "
                         "(a resumed run reads RUN_DIR/config.toml; change it with --set)")
    die_with_launcher()  # under torchrun: no rank outlives a killed torchrun
    stop = stop_on_signals(StopRequest)
    cache = cache_dir(args)
    launch = Launch(rank=int(os.environ.get("RANK", 0)),
                    world=int(os.environ.get("WORLD_SIZE", 1)),
                    local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                    progress=not args.no_progress, stop=stop)
    summary = train(args.config, args.set, out=args.out, resume=args.resume,
                    overwrite=args.overwrite, launch=launch, cache=cache)
    if launch.rank == 0:
        print(json.dumps(summary))
    return 0


def stop_on_signals(make_request):
    """A stop request (``make_request()``) that SIGINT (Ctrl-C) and SIGTERM (kill, job
    schedulers) set: finish the current step, save, and stop (a second one: stop at once,
    keeping the last checkpoint). Installed explicitly: a process started in the background
    by a non-interactive shell inherits SIGINT as *ignored*, and Python then never raises
    KeyboardInterrupt."""
    def request(signum, frame):
        stop.signal(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, request)
    stop = make_request()
    return stop


def summary(args: argparse.Namespace) -> int:
    from .. import architectures
    from ..config import load_run_config
    from ..models import build_model, parameter_counts

    path = Path(args.config)
    cfg = load_run_config(path / "config.toml" if path.is_dir() else path, args.set,
                          fixed=architectures.fixes).model
    if cfg.vocab_size == 0:
        raise ValueError(f"{args.config} leaves vocab_size to the data; give it with "
                         "--set model.vocab_size=N (or pass a trained RUN_DIR)")
    model = build_model(cfg, "meta")  # shapes only
    parts, total = parameter_counts(model)
    print(f"{args.config}: {type(model).__name__} ({cfg.arch})")
    for name, n in parts:
        print(f"  {name:<12} {n:>12,} parameters")
    print(f"  {'total':<12} {total:>12,} parameters (shared weights counted once)")
    return 0


def average(args: argparse.Namespace) -> int:
    from .. import checkpoint, rundir

    run_dir = Path(args.run_dir)
    rundir.read_config(run_dir)  # the clear "not a run directory" error
    path, paths = checkpoint.write_average(run_dir, args.last)
    print(f"vaswani average: {len(paths)} checkpoints ({paths[0].stem} .. {paths[-1].stem}) "
          f"-> {path}; use it with --weights averaged", file=sys.stderr)
    return 0
