"""The ``vaswani`` command line. The only place that reads the environment or sets seeds."""

from __future__ import annotations

import argparse
import sys

from . import __version__


def _summary(args: argparse.Namespace) -> int:
    from .config import ModelConfig, load_toml
    from .models import build_model

    data = load_toml(args.config)
    cfg = ModelConfig.from_dict(data.get("model", {}))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani",
        description="Train and use Transformers (encoder-decoder, decoder-only, encoder-only).")
    parser.add_argument("--version", action="version", version=f"vaswani {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("summary", help="build the model of a config file and count parameters",
                       description="Build the [model] of CONFIG.toml and print parameter counts.")
    p.add_argument("config", metavar="CONFIG.toml")
    p.set_defaults(func=_summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"vaswani: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
