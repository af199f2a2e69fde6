"""Every benchmark in a row: ``python -m benchmarks [--quick] [--out DIR] [--work DIR]
[--nanogpt CHECKOUT] [--only NAME ...]`` (``make bench``).

Each module of this package that measures the product runs here, each in a process of its own,
and writes DIR/bench-NAME.json (DIR defaults to docs/results) and prints its table:

    train_step, generation, scaling   training steps, cached decoding, attention's cost by length
    serve                              ``vaswani serve`` under concurrent clients (its parts)
    offline                            offline decoding against CTranslate2 (vaswani[export])
    llm                                SmolLM2 against llama.cpp (a peer venv, built once)
    kv_cache                           SmolLM2 over a float32 and a bfloat16 key/value cache
    memory                             SmolLM2's peak memory, float32, int8 and int4
    finetune                           SmolLM2's LoRA step against peft + transformers, QLoRA
    structured                         SmolLM2's time per token, free and held to a JSON schema
    export                             a trained translator's exports: needs ``make demo``'s run
    distributed                        sharded against data-parallel training, two processes
    nanogpt                            against nanoGPT's CPU recipe: needs ``--nanogpt CHECKOUT``
    trees                              this checkout against an earlier one: needs ``--before REV``
    data                               data at scale (gigabytes of scratch, an hour or more)
    gpu                                on a CUDA GPU only

What cannot run here (no CUDA, no nanoGPT checkout, no demo run) is said and skipped, not
failed. ``--quick`` runs each in its shorter form (fewer steps, sizes and requests; a minute
of each 10-minute race); its numbers are a smoke test. The decision experiments are in
experiments/, outside this package (its README).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import ROOT

ORDER = ("train_step", "generation", "scaling", "serve", "offline", "llm", "speculate", "streams",
         "kv_cache", "memory", "finetune", "structured", "export", "distributed", "nanogpt",
         "trees", "data", "gpu")


def plan(name: str, out: Path, work: Path, quick: bool, nanogpt: str | None,
         before: str | None = None) -> list[list[str]] | str:
    """The argument lists of ``python -m benchmarks.NAME`` for one benchmark, or why it cannot
    run on this machine."""
    import torch

    from vaswani.devices import bf16_is_fast

    q = ["--quick"] if quick else []
    if name == "scaling":  # bf16 only where this CPU has it natively (emulated: the emulation)
        return [[*q, "--dtype", d, "--json", f"{out}/bench-scaling-{d}.json",
                 "--plot", f"{out}/scaling-{d}.png"]
                for d in (("fp32", "bf16") if bf16_is_fast(torch.device("cpu")) else ("fp32",))]
    if name == "llm":
        return [["--work", str(work), "--json", f"{out}/bench-llm.json"]]  # one length
    if name == "speculate":  # the run llm imported (or imports now), its int8 package
        return [["--work", str(work), "--json", f"{out}/bench-speculate.json"]]
    if name == "kv_cache":  # the run llm imported (or imports now), two int4 packages
        return [["--work", str(work), *(["--contexts", "256", "--rounds", "1"] if quick else []),
                 "--json", f"{out}/bench-kv-cache.json"]]
    if name == "streams":  # the run llm imported (or imports now), its int8 package
        return [["--work", str(work), "--json", f"{out}/bench-streams.json"]]
    if name == "finetune":  # the run llm imported (or imports now), and its hf export
        return [["--work", str(work), *(["--steps", "3", "--rounds", "1"] if quick else []),
                 "--json", f"{out}/bench-finetune.json"]]
    if name == "structured":  # the run llm imported (or imports now), its int8 package
        return [["--work", str(work), "--quantize", "int8",
                 *(["--rounds", "1"] if quick else []), "--json", f"{out}/bench-structured.json"]]
    if name == "memory":  # the run llm imported (or imports now)
        return [[*([f"--quantize={k}"] if k != "fp32" else []), "--work", str(work),
                 "--json", f"{out}/bench-memory-{k}.json"] for k in ("fp32", "int8", "int4")]
    if name == "export":
        demo = ROOT / "runs" / "demo-bible-en-es"
        if not (demo / "config.toml").exists():
            return f"needs a trained translator at {demo}: run `make demo` first"
        return [[str(demo), *(["--limit", "100"] if quick else []),
                 "--json", f"{out}/bench-export.json"]]
    if name == "nanogpt":
        if not nanogpt:
            return ("needs a nanoGPT checkout (git clone https://github.com/karpathy/nanoGPT): "
                    "--nanogpt CHECKOUT")
        return [["--nanogpt", nanogpt, "--minutes", "1" if quick else "10",
                 "--work", str(work / "nanogpt"), "--json", f"{out}/bench-nanogpt.json"]]
    if name == "trees":
        if not before:
            return "needs an earlier checkout or revision to race this one against: --before REV"
        return [[before, str(ROOT), "--work", str(work / "trees"),
                 *(["--rounds", "1", "--no-smollm2"] if quick else []),
                 "--json", f"{out}/bench-trees.json"]]
    if name == "data":
        return [[*(["--sizes", "lm:10MB", "pairs:30k"] if quick else []),
                 "--work", str(work / "data"), "--json", f"{out}/bench-data.json"]]
    if name == "gpu":
        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
        card = torch.cuda.get_device_name().split()[-1].lower()  # "NVIDIA H200" -> h200
        return [[*q, "--json", f"{out}/bench-gpu-{card}.json"]]
    return [[*q, "--json", f"{out}/bench-{name.replace('_', '-')}.json"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's shorter form")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results"), metavar="DIR",
                        help="where the JSON and plots go (default docs/results)")
    parser.add_argument("--work", metavar="DIR",
                        help="scratch: imported models, runs, data (default: a temp dir)")
    parser.add_argument("--nanogpt", metavar="CHECKOUT", help="a nanoGPT clone to race")
    parser.add_argument("--before", metavar="REV", help="an earlier checkout or revision for "
                        "benchmarks.trees to race this one against")
    parser.add_argument("--only", nargs="+", choices=ORDER, metavar="NAME",
                        help=f"only these, in this order: {', '.join(ORDER)}")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="vaswani-bench-"))
    skipped = []
    for name in args.only or ORDER:
        runs = plan(name, out, work, args.quick, args.nanogpt, args.before)
        if isinstance(runs, str):
            print(f"\n# benchmarks.{name}: skipped, {runs}", flush=True)
            skipped.append(f"{name} ({runs})")
            continue
        for rest in runs:
            print(f"\n$ python -m benchmarks.{name} {' '.join(rest)}", flush=True)
            subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *rest], check=True,
                           cwd=ROOT)
    if skipped:
        print("\nskipped: " + "; ".join(skipped))


if __name__ == "__main__":
    main()
