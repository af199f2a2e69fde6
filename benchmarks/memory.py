"""A language model's memory after loading and generating a few tokens: ``python -m
benchmarks.memory [RUN_DIR] [--quantize int8|int4] [--work DIR] [--json OUT.json]``; without
RUN_DIR, SmolLM2-135M-Instruct imported into ``--work`` (as ``benchmarks.llm`` does).

Run in a process of its own, as the commands run (their malloc settings): ``vaswani.load``,
then 4 greedy tokens of one prompt, then the process's resident memory (``VmRSS``) and its
peak so far (``VmHWM``), from ``/proc/self/status``. The peak is the load's, where a float
tensor waits to be quantized (docs/performance.md, "Generating text").
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .common import hardware, smollm2, status_mb


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", help="a language model's run (default: SmolLM2)")
    parser.add_argument("--quantize", choices=["int8", "int4"])
    parser.add_argument("--work", metavar="DIR", help="where SmolLM2 is imported without "
                        "RUN_DIR (default: a temp dir)")
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)
    if args.run_dir is None:
        import tempfile

        args.run_dir = str(smollm2(Path(args.work or tempfile.mkdtemp(prefix="vaswani-mem-"))))
    import vaswani
    from vaswani.cli.process import keep_freed_memory

    keep_freed_memory()  # as `vaswani generate` and `vaswani serve` run
    run = vaswani.load(args.run_dir, quantize=args.quantize)
    text = run.generate("The capital of France is", max_new_tokens=4, temperature=0)
    mb = status_mb("VmRSS", "VmHWM")
    result = {"run_dir": args.run_dir, "quantize": args.quantize or "float32",
              "resident_mb": mb["VmRSS"], "peak_mb": mb["VmHWM"], "text": text,
              "machine": hardware(), "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
