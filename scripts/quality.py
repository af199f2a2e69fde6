"""`make quality`: train the real-data presets and record their test metrics.

    python scripts/quality.py [bbc-news] [shakespeare-char] [bible-en-es] [--set ...]

For each preset: prepare its dataset, `vaswani train` it into runs/quality/NAME (timed),
`vaswani evaluate --split test`, and write docs/results/NAME.json (command, wall time,
hardware, training summary, test metrics) and docs/results/NAME-loss.png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from vaswani.devices import cpu_generation, cpu_name

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ["bbc-news", "shakespeare-char", "bible-en-es"]


def run_preset(name: str, overrides: list[str]) -> dict:
    vaswani = [sys.executable, "-m", "vaswani"]
    run_dir = ROOT / "runs" / "quality" / name
    sets = [x for o in overrides for x in ("--set", o)]
    train_cmd = ["train", f"configs/{name}.toml", "--out", str(run_dir.relative_to(ROOT)),
                 "--overwrite", *sets]
    start = time.perf_counter()
    done = subprocess.run(vaswani + train_cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"training {name} failed")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    eval_cmd = ["evaluate", str(run_dir.relative_to(ROOT)), "--split", "test"]
    test = json.loads(subprocess.run(vaswani + eval_cmd, cwd=ROOT, check=True,
                                     stdout=subprocess.PIPE, text=True).stdout)
    out = ROOT / "docs" / "results"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(run_dir / "loss.png", out / f"{name}-loss.png")
    record = {"preset": name, "train_command": "vaswani " + " ".join(train_cmd),
              "evaluate_command": "vaswani " + " ".join(eval_cmd),
              "wall_seconds": round(seconds, 1), "cpu": cpu_name(), "cores": _cores(),
              "cpu_generation": cpu_generation(),
              "train_summary": summary, "test": test}
    (out / f"{name}.json").write_text(json.dumps(record, indent=2, ensure_ascii=False))
    print(json.dumps({"preset": name, "minutes": round(seconds / 60, 1), "test": test}))
    return record


def _cores() -> int:
    import os
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("presets", nargs="*", metavar="PRESET", help=f"any of {PRESETS}")
    parser.add_argument("--set", action="append", default=[], help="passed to vaswani train")
    args = parser.parse_args()
    unknown = [p for p in args.presets if p not in PRESETS]
    if unknown:
        parser.error(f"unknown preset(s) {unknown}; choose from {PRESETS}")
    for name in args.presets or PRESETS:
        run_preset(name, args.set)


if __name__ == "__main__":
    main()
