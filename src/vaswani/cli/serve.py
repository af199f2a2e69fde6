"""``vaswani serve``."""

from __future__ import annotations

import argparse
import os
import sys

from .common import (
    DRAFT_HELP,
    EAGER_HELP,
    FAST_PREFILL_HELP,
    KV_CACHE,
    KV_CACHE_HELP,
    QUANTIZE,
    QUANTIZE_HELP,
    SPECULATE_HELP,
    eager,
    nonnegative,
    set_draft,
)


def add_commands(sub, cache: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "serve", help="serve runs over HTTP (OpenAI-compatible) with a page to use and look "
        "inside them", description="Load RUN_DIRs and serve them over HTTP: /v1/completions and "
        "/v1/chat/completions (decoders; OpenAI's API, streaming), /v1/embeddings and "
        "/v1/classify (encoders), /v1/translate (encoder-decoders), /v1/attention (any), "
        "/v1/models and /health, and at / a page to use each run and explore its attention. "
        "Translators and language models run on an inference engine that decodes every "
        "request with the others, each joining at the next step and leaving when it ends; "
        "an encoder's requests that arrive together are batched. /metrics has Prometheus "
        "metrics. Binds to 127.0.0.1 unless --host says "
        "otherwise; with --api-key (or $VASWANI_API_KEY) every /v1 route needs "
        "'Authorization: Bearer KEY'.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="runs to serve, each under its folder's name (or --name). LoRA "
                        "runs of one base (two or more, or beside the base run) share one "
                        "copy of its weights, each request computed with its run's adapters")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8000, help="port to listen on, 1-65535 "
                   "(default 8000)")
    p.add_argument("--allowed-hosts", metavar="NAMES", help="comma-separated host names a "
                   "request's Host header may carry ('*' for any); default: the loopback "
                   "names, and --host when it is one address. A web page cannot then reach the "
                   "server through DNS rebinding")
    p.add_argument("--name", action="append", metavar="NAME",
                   help="the model name of each RUN_DIR, in order (default: its folder name)")
    p.add_argument("--api-key", metavar="KEY", help="require this bearer token")
    p.add_argument("--max-batch", type=int, default=64, metavar="N",
                   help="sequences decoded together at most (a beam search takes one per "
                        "hypothesis), or an encoder's requests batched together (1 = one at "
                        "a time; default 64)")
    p.add_argument("--max-wait-ms", type=float, default=5.0, metavar="M",
                   help="how long an encoder's request waits for others to batch with "
                        "(default 5)")
    p.add_argument("--max-queue", type=int, default=256, metavar="N",
                   help="requests waiting per model before 503s (default 256)")
    p.add_argument("--fast-lane", type=nonnegative, default=None, metavar="N",
                   help="decode requests of at most N tokens at every step and, while they "
                        "run, the others at every other step, so that a short request among "
                        "long ones is not as slow per token as they are (0 = off; default 32 "
                        "on a CPU, where a step costs about its rows; off on a GPU)")
    p.add_argument("--prefix-cache", type=nonnegative, default=256, metavar="MB",
                   help="memory for the keys and values of prompts' leading tokens, kept so "
                        "that a request starting with the same tokens (a system prompt, a "
                        "chat's earlier turns) computes only the rest; the least recently "
                        "used go first; taken from the engine's 1 GiB cache (0 = off; "
                        "default 256)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.add_argument("--quantize", choices=QUANTIZE, help=QUANTIZE_HELP)
    p.add_argument("--kv-cache", choices=KV_CACHE, help=KV_CACHE_HELP)
    p.add_argument("--fast-prefill", action=argparse.BooleanOptionalAction,
                   help=FAST_PREFILL_HELP)
    p.add_argument("--eager", action="store_true", help=EAGER_HELP)
    p.add_argument("--speculate", type=nonnegative, metavar="N", help=SPECULATE_HELP)
    p.add_argument("--draft", metavar="RUN_DIR", help=DRAFT_HELP)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="uvicorn's log level")
    p.set_defaults(func=serve)


def port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"port ({text}) must be a number in 1-65535")
    return int(text)


def allowed_hosts(names: str | None, host: str) -> list[str]:
    from ..serve.app import LOOPBACK

    if names:
        return [n.strip() for n in names.split(",") if n.strip()]
    extra = [] if host in ("0.0.0.0", "::", *LOOPBACK) else [host]
    return [*LOOPBACK, *extra]


def serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401  (both used by _serve; missing: say how to install them)
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ValueError(f"vaswani serve needs FastAPI and uvicorn ({e.name} is missing): "
                         "pip install 'vaswani[serve]'") from None
    import torch

    from ..engine import EngineConfig
    from ..inference.shared import load_runs

    if args.prefix_cache << 20 >= EngineConfig.cache_bytes:
        raise ValueError(f"--prefix-cache ({args.prefix_cache} MB) must be less than the "
                         f"engine's cache, {EngineConfig.cache_bytes >> 20} MB")
    from ..serve import name_runs

    sock = listening_socket(args.host, args.port)  # before loading: a port in use fails fast

    # This thread answers HTTP; the models run in a thread of their own with torch's threads
    # (serve/loop.py: a second team of OpenMP threads would slow every operator down).
    # Loading with one thread makes no team here; the models' thread then sets the count
    # back (it is the process's, not a thread's), and this thread runs none of their work.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # LoRA runs of one base (or beside it) share one copy of it (inference/shared.py)
        runs = load_runs(name_runs(args.run_dirs, args.name), device=args.device,
                         quantize=args.quantize, kv_cache=args.kv_cache,
                         fast_prefill=args.fast_prefill, say=lambda line: print(
                             f"vaswani serve: {line}", file=sys.stderr, flush=True),
                         **eager(args))
        for run in runs.values():
            if args.speculate is not None and run.decodes and not run.family.cross:
                run.set_decode(speculate=args.speculate)
        set_draft(args, runs.values())
        return _serve(args, sock, runs, threads)
    finally:  # a failed load, or the server stopped: the count as the caller had it
        torch.set_num_threads(threads)
        sock.close()


def _serve(args: argparse.Namespace, sock, runs: dict, threads: int) -> int:
    """Serve the loaded ``runs`` on the bound socket until stopped."""
    import uvicorn

    from ..serve.app import Limits, create_app

    key = args.api_key or os.environ.get("VASWANI_API_KEY") or None
    app = create_app(runs, api_key=key, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                     max_queue=args.max_queue, fast_lane=args.fast_lane, limits=Limits(),
                     allowed_hosts=allowed_hosts(args.allowed_hosts, args.host),
                     threads=threads, prefix_cache_mb=args.prefix_cache)
    where = f"http://{args.host}:{args.port}"
    print(f"vaswani serve: {', '.join(f'{n} ({r.task.name})' for n, r in runs.items())} on "
          f"{where}{' (API key required)' if key else ''}; the page is at {where}/",
          file=sys.stderr, flush=True)
    if args.host in ("0.0.0.0", "::") and not args.allowed_hosts:
        print("vaswani serve: requests must name a loopback host; to reach the server from "
              "other machines, add --allowed-hosts with the names they use (or '*')",
              file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                           log_level=args.log_level))
    server.run(sockets=[sock])  # the socket bound above: no second bind to fail
    return 0


def listening_socket(host: str, port: int):
    """A TCP socket bound to ``host``:``port``, as uvicorn binds one; an address in use (or
    not this machine's) is an error that says so."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        why = ("is in use (another server?); choose another --port"
               if e.errno == errno.EADDRINUSE else f"cannot be listened on ({e.strerror})")
        raise ValueError(f"{host}:{port} {why}") from None
    sock.set_inheritable(True)
    return sock
