"""Using a run: ``vaswani translate | generate | classify | embed | evaluate | attention``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import (
    DRAFT_HELP,
    EAGER_HELP,
    FAST_PREFILL_HELP,
    KV_CACHE,
    KV_CACHE_HELP,
    QUANTIZE,
    QUANTIZE_HELP,
    SPECULATE_HELP,
    cache_dir,
    load_run,
    one_line,
    positive,
    read_lines,
    set_draft,
)


def add_commands(sub, cache: argparse.ArgumentParser) -> None:
    def run_parser(name: str, help: str, description: str, parents=()) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=description, parents=list(parents))
        p.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by vaswani train")
        p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
        p.add_argument("--weights", choices=["best", "last", "averaged"], default="best",
                       help="best (model.safetensors, default), last (the latest checkpoint) "
                            "or averaged (averaged.safetensors, from vaswani average)")
        return p

    def controls(p: argparse.ArgumentParser) -> None:
        """The decoding controls translate and generate share (default: [decode])."""
        p.add_argument("--engine", choices=["vaswani", "ct2"], default="vaswani",
                       help="ct2: RUN_DIR is a folder written by `vaswani export --format ct2`"
                            ", run by CTranslate2 with the run's tokenizer (default vaswani)")
        p.add_argument("--quantize", choices=QUANTIZE, help=QUANTIZE_HELP)
        p.add_argument("--kv-cache", choices=KV_CACHE, help=KV_CACHE_HELP)
        p.add_argument("--eager", action="store_true", help=EAGER_HELP)
        p.add_argument("--repetition-penalty", type=float, metavar="P",
                       help="> 1 discourages tokens already in the output (1 = off)")
        p.add_argument("--no-repeat-ngram-size", type=int, metavar="N",
                       help="never repeat an n-gram of N tokens (0 = off)")
        p.add_argument("--min-length", type=int, metavar="N",
                       help="generate at least N tokens before the end")

    p = run_parser("translate", "translate lines with an encoder-decoder run",
                   "Read lines (stdin, or --input FILE) and write exactly one line per input "
                   "line: its translation (an empty line stays empty). With --n-best K, the "
                   "line holds K tab-separated (translation, score) pairs, best first.")
    p.add_argument("--input", metavar="FILE", help="read lines from FILE instead of stdin")
    p.add_argument("--beam", type=int, help="beam size (1 = greedy; default from [decode])")
    p.add_argument("--n-best", type=int, default=1, metavar="K", help="hypotheses per line")
    p.add_argument("--length-penalty", type=float, metavar="ALPHA",
                   help="GNMT alpha: score = log P / ((5 + len) / 6) ** alpha")
    p.add_argument("--workers", type=positive, default=1, metavar="N",
                   help="split the lines across N processes on a CPU, each with its own copy "
                        "of the run and 1/N of the threads, as CTranslate2's inter_threads: "
                        "faster on a small CPU, where one process's Python leaves a core idle "
                        "(each starts in about a load's time; default 1)")
    controls(p)
    p.set_defaults(func=translate)

    p = run_parser("generate", "continue a prompt with a language-model run",
                   "Stream a continuation of --prompt to stdout as it is produced.")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, metavar="N",
                   help="tokens to generate at most (default [decode] max_new_tokens)")
    p.add_argument("--temperature", type=float, metavar="T", help="0 = greedy")
    p.add_argument("--top-k", type=int, metavar="K",
                   help="sample among the K most likely tokens only (0 = off)")
    p.add_argument("--top-p", type=float, metavar="P",
                   help="sample among the most likely tokens whose probabilities sum to P "
                        "(1 = off)")
    p.add_argument("--seed", type=int, metavar="S", help="make sampling reproducible")
    p.add_argument("--stop", action="append", metavar="TEXT",
                   help="end the output where TEXT appears (repeatable)")
    p.add_argument("--presence-penalty", type=float, metavar="X",
                   help="OpenAI's: lower a generated token's score once, by X (-2..2)")
    p.add_argument("--frequency-penalty", type=float, metavar="X",
                   help="OpenAI's: lower a token's score by X per occurrence so far (-2..2)")
    p.add_argument("--speculate", type=int, metavar="N", help=SPECULATE_HELP)
    p.add_argument("--draft", metavar="RUN_DIR", help=DRAFT_HELP)
    p.add_argument("--json-schema", metavar="FILE", help="write JSON that the JSON schema in "
                   "FILE accepts, and end where it ends: every token is chosen among those "
                   "that keep the text inside the schema (structured output)")
    p.add_argument("--json", action="store_true", help="write one JSON object (any keys)")
    p.add_argument("--fast-prefill", action=argparse.BooleanOptionalAction,
                   help=FAST_PREFILL_HELP)
    controls(p)
    p.set_defaults(func=generate)

    p = run_parser("classify", "classify lines with an encoder run",
                   "Read lines (stdin, or --input FILE); print label<TAB>probability for each.")
    p.add_argument("--input", metavar="FILE", help="read lines from FILE instead of stdin")
    p.set_defaults(func=classify)

    p = run_parser("embed", "sentence embeddings from an encoder run (e.g. imported BERT)",
                   "Read lines (stdin, or --input FILE); write one L2-normalised, mean-pooled "
                   "embedding per line: a JSON array of arrays (stdout or --out FILE.json), "
                   "or a NumPy array with --out FILE.npy.")
    p.add_argument("--input", metavar="FILE", help="read lines from FILE instead of stdin")
    p.add_argument("--out", metavar="FILE.json|FILE.npy",
                   help="write the embeddings here (.npy: a NumPy array; default stdout, JSON)")
    p.add_argument("--batch-size", type=positive, default=32, metavar="N",
                   help="lines encoded at a time (default 32)")
    p.set_defaults(func=embed)

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
    p.set_defaults(func=evaluate)

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
    p.set_defaults(func=attention)


def _controls(args: argparse.Namespace) -> dict:
    return {"repetition_penalty": args.repetition_penalty,
            "no_repeat_ngram_size": args.no_repeat_ngram_size, "min_length": args.min_length}


def translate(args: argparse.Namespace) -> int:
    run = load_run(args)
    lines = read_lines(args.input)
    results = run.translate(lines, beam=args.beam, n_best=args.n_best,
                            length_penalty=args.length_penalty, **_controls(args))
    for line, r in zip(lines, results, strict=True):  # exactly one output line per input line
        if args.n_best > 1 and not line.strip():
            print()
        elif args.n_best > 1:
            print("\t".join(f"{one_line(text, tabs=True)}\t{score:.4f}" for text, score in r))
        else:
            print(one_line(r))
    return 0


def json_schema(args: argparse.Namespace) -> dict | None:
    """--json-schema FILE read (an error names the file, line and column of bad JSON), or
    --json's any object; None for free text."""
    if args.json_schema and args.json:
        raise ValueError("--json-schema and --json each ask for a format: give one")
    if args.json:
        return {"type": "object"}
    if not args.json_schema:
        return None
    path = Path(args.json_schema)
    if not path.is_file():
        raise FileNotFoundError(f"--json-schema {path}: no such file")
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}, line {e.lineno}, column {e.colno}: not JSON ({e.msg})") \
            from None
    if not isinstance(schema, dict):
        raise ValueError(f"{path} holds {type(schema).__name__}; a JSON schema is an object")
    return schema


def generate(args: argparse.Namespace) -> int:
    run = load_run(args)
    set_draft(args, [run])
    echoed = False  # the prompt is echoed with the first new text: a refused request prints none

    def stream(text: str) -> None:
        nonlocal echoed
        if not echoed:
            sys.stdout.write(args.prompt)
            echoed = True
        sys.stdout.write(text)
        sys.stdout.flush()

    run.generate(args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                 top_k=args.top_k, top_p=args.top_p, seed=args.seed, stream=stream,
                 stop=args.stop, presence_penalty=args.presence_penalty,
                 frequency_penalty=args.frequency_penalty, speculate=args.speculate,
                 json_schema=json_schema(args), **_controls(args))
    stream("")  # the prompt, if nothing new came
    sys.stdout.write("\n")
    said = run.engine_for(1).speculation
    if said.passes:
        print(f"speculation: {said.accepted} of {said.guessed} guessed tokens held "
              f"({said.rate:.0%}), in {said.passes} passes", file=sys.stderr)
    return 0


def classify(args: argparse.Namespace) -> int:
    run = load_run(args)
    for label, p in run.classify(read_lines(args.input)):
        print(f"{label}\t{p:.4f}")
    return 0


def embed(args: argparse.Namespace) -> int:
    from ..atomic import atomic_write, atomic_write_text

    run = load_run(args)
    vectors = run.embed(read_lines(args.input), batch_size=args.batch_size)
    if args.out and args.out.endswith(".npy"):
        import numpy as np

        def write(tmp: Path) -> None:
            with tmp.open("wb") as f:  # np.save to a path would add ".npy" to the tmp name
                np.save(f, vectors.numpy())

        atomic_write(Path(args.out), write)
    else:
        text = json.dumps([[round(x, 7) for x in row] for row in vectors.tolist()])
        if not args.out:
            print(text)
            return 0
        atomic_write_text(Path(args.out), text + "\n")
    print(f"wrote {tuple(vectors.shape)} embeddings to {args.out}", file=sys.stderr)
    return 0


def evaluate(args: argparse.Namespace) -> int:
    from ..atomic import atomic_write_text

    run = load_run(args)
    if args.save_outputs and not run.produces_outputs:
        raise ValueError(f"--save-outputs: {run.describes} is scored on the text itself and "
                         "produces no outputs")
    data = [args.data] if args.data else run.data_files(args.split, cache_dir(args))
    outputs: list[str] | None = [] if args.save_outputs else None
    result = run.evaluate(data, beam=args.beam, outputs=outputs)
    if outputs is not None:
        atomic_write_text(Path(args.save_outputs), "".join(f"{one_line(o)}\n" for o in outputs))
        result["outputs"] = args.save_outputs
    print(json.dumps(result))
    return 0


def attention(args: argparse.Namespace) -> int:
    from ..atomic import atomic_write_text
    from ..viz.attention import plot_attention

    run = load_run(args)
    if args.out.lower().endswith((".html", ".htm")):
        from ..serve import standalone_explorer

        view = run.attention_view(args.text, args.target)
        atomic_write_text(Path(args.out), standalone_explorer(view, f"{run.run_dir}: {args.text}"))
        print(f"wrote {args.out} (the attention explorer: open it in a browser, offline)")
        return 0
    maps = run.attention(args.text, args.target)
    out = plot_attention(maps, Path(args.out), layer=args.layer,
                         head=None if args.all_heads else args.head)
    n_layers = next(iter(maps.values()))["weights"].size(0)
    print(f"wrote {out} ({', '.join(maps)}; layer {args.layer % n_layers}, "
          f"{'all heads' if args.all_heads else f'head {args.head}'})")
    return 0
