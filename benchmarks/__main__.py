"""All benchmarks in a row: ``python -m benchmarks [--quick] [--out DIR]`` (``make bench``).

Writes DIR/bench-train-step.json, bench-generation.json, bench-scaling-fp32.json,
bench-scaling-bf16.json (where the CPU has native bf16), scaling-*.png, bench-serve.json and
bench-llm.json
(DIR defaults to docs/results),
and prints a markdown table for each. ``--quick`` runs fewer steps, lengths and requests.
``python -m benchmarks.data`` (data at scale, gigabytes of scratch space, an hour or more) runs
on its own.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from .common import ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter version (~2 minutes)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results"), metavar="DIR")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    quick = ["--quick"] if args.quick else []
    runs = [["train_step", "--json", out / "bench-train-step.json"],
            ["generation", "--json", out / "bench-generation.json"]]
    import torch

    from vaswani.devices import bf16_is_fast

    # bf16 only where this CPU has it natively (emulated it measures the emulation)
    for dtype in ("fp32", "bf16") if bf16_is_fast(torch.device("cpu")) else ("fp32",):
        runs.append(["scaling", "--dtype", dtype, "--json", out / f"bench-scaling-{dtype}.json",
                     "--plot", out / f"scaling-{dtype}.png"])
    runs.append(["serve", "--json", out / "bench-serve.json"])
    runs.append(["llm", "--json", out / "bench-llm.json"])
    for name, *rest in runs:
        cmd = [sys.executable, "-m", f"benchmarks.{name}", *quick, *map(str, rest)]
        print(f"\n$ python -m benchmarks.{name} {' '.join(quick + list(map(str, rest)))}",
              flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)


if __name__ == "__main__":
    main()
