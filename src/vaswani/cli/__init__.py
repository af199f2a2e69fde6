"""The ``vaswani`` command line: one module per group of commands, each handler a few lines
that parse the arguments and call the library.

    train.py    train, summary, average
    data.py     data list | prepare | encode | clean
    use.py      translate, generate, classify, embed, evaluate, attention
    serve.py    serve
    convert.py  import, export

    common.py   what several share (the cache folder, loading a run, input lines)
    process.py  the process-wide settings a command makes (malloc's thresholds)

This package is the only place that reads the environment (``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` from torchrun, ``VASWANI_CACHE``, ``VASWANI_API_KEY``), the arguments and the
signals. Random seeds are the config's (``[train] seed``, ``--seed``), set where they are used.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from .. import __version__
from ..data.registry import FetchError
from . import convert, data, serve, train, use
from .common import CACHE_HELP
from .process import keep_freed_memory


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani",
        description="Train and use Transformers (encoder-decoder, decoder-only, encoder-only).")
    parser.add_argument("--version", action="version", version=f"vaswani {__version__}")
    cache = argparse.ArgumentParser(add_help=False)  # a parent: --cache for every command
    cache.add_argument("--cache", metavar="DIR", help=CACHE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for group in (train, data, use, serve, convert):
        group.add_commands(sub, cache)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    keep_freed_memory()  # the process is the command's own: process.py
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning
            return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, FetchError, ImportError) as e:
        print(f"vaswani: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # permissions, a full disk, a path that is not a directory ...
        where = f": {e.filename}" if e.filename else ""
        print(f"vaswani: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        if type(e).__name__ != "RankZeroFailed":  # training/distributed.py: rank 0 says why
            raise
        if not e.quiet:
            print(f"vaswani: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # training's Stopped says what was saved
        print(f"vaswani: {e}" if type(e).__name__ == "Stopped" else
              "vaswani: interrupted (a run being trained keeps its last checkpoint)",
              file=sys.stderr)
        return 130


def _warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr, like the errors (not Python's file:line: form)."""
    print(f"vaswani: warning: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
