"""The ``vaswani`` command line. The only place that reads the environment or sets seeds."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import __version__


def _summary(args: argparse.Namespace) -> int:
    from .config import load_run_config
    from .models import build_model

    path = Path(args.config)
    cfg = load_run_config(path / "config.toml" if path.is_dir() else path, args.set).model
    if cfg.vocab_size == 0:
        raise ValueError(f"{args.config} leaves vocab_size to the data; give it with "
                         "--set model.vocab_size=N (or pass a trained RUN_DIR)")
    model = build_model(cfg)
    print(f"{args.config}: {type(model).__name__} ({cfg.arch})")
    total = 0
    for name, child in model.named_children():
        n = sum(p.numel() for p in child.parameters())
        total += n
        print(f"  {name:<12} {n:>12,} parameters")
    unique = sum(p.numel() for p in model.parameters())  # tied weights counted once
    print(f"  {'total':<12} {unique:>12,} parameters (shared weights counted once)")
    return 0


def _train(args: argparse.Namespace) -> int:
    from .training.run import Launch, train

    launch = Launch(rank=int(os.environ.get("RANK", 0)),
                    world=int(os.environ.get("WORLD_SIZE", 1)),
                    local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                    progress=not args.no_progress)
    if args.config and args.resume:
        raise ValueError("give either CONFIG.toml or --resume RUN_DIR, not both "
                         "(a resumed run reads RUN_DIR/config.toml; change it with --set)")
    summary = train(args.config, args.set, out=args.out, resume=args.resume,
                    overwrite=args.overwrite, launch=launch)
    if launch.rank == 0:
        print(json.dumps(summary))
    return 0


TRAIN_HELP = """\
Train a model on the [data] of CONFIG.toml and write a run directory:

  RUN_DIR/config.toml        the fully resolved config
  RUN_DIR/tokenizer/         the tokenizer(s), and class labels
  RUN_DIR/model.safetensors  the best weights by [train] best_metric
  RUN_DIR/last/              everything needed to resume exactly (--resume)
  RUN_DIR/metrics.jsonl      one JSON object per log line; RUN_DIR/loss.png at the end

Interrupt with Ctrl-C at any time: the latest state is saved first. Multi-process:
  torchrun --nproc_per_node=2 -m vaswani train CONFIG.toml
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani",
        description="Train and use Transformers (encoder-decoder, decoder-only, encoder-only).")
    parser.add_argument("--version", action="version", version=f"vaswani {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("summary", help="count the parameters of a config's or a run's model",
                       description="Build the [model] of CONFIG.toml (or of RUN_DIR) and "
                                   "print parameter counts.")
    p.add_argument("config", metavar="CONFIG.toml|RUN_DIR")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set model.vocab_size=8000")
    p.set_defaults(func=_summary)

    p = sub.add_parser("train", help="train a model from a config file",
                       description=TRAIN_HELP, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("config", nargs="?", metavar="CONFIG.toml",
                   help="config with [model], [data], [train], [decode] sections")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set train.lr=3e-4 (repeatable)")
    p.add_argument("--out", metavar="RUN_DIR", help="run directory (default runs/<config name>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue this run exactly where it "
                   "stopped (raise train.max_steps with --set to train longer)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in RUN_DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"vaswani: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vaswani: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
