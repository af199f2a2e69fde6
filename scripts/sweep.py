"""Train a grid of configs under one budget and tabulate what each learned.

    python scripts/sweep.py configs/bible-en-es-demo.toml --out runs/sweep \\
        --axis train.optimizer=adamw,muon --axis train.lr=1e-3,2e-3 --steps 1500 \\
        --json docs/results/sweep.json --markdown docs/results/sweep.md

Every point of the grid (the product of the ``--axis`` values, each ``section.key=v1,v2``)
is one `vaswani train CONFIG --set ...` in a process of its own into ``OUT/<point>``, with
the same budget: ``--steps N`` (fixed work: the same result to the digit on one machine) or
``--minutes M`` (equal wall-clock: the learning-rate schedule is planned over the steps the
budget reaches, see training/loop.py). Then `vaswani evaluate` scores the run on ``--split``
(test by default): sacreBLEU and chrF for a translator, loss and bits for a language model,
accuracy for a classifier. A point whose directory already holds a result is not trained
again, so an interrupted sweep continues where it stopped (``--again`` to redo).

The table (printed, and with ``--markdown``/``--json`` written) has one row per point: the
axes' values, the steps taken, the training minutes, the median training tokens/s, the
final validation loss and the test metrics.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
from pathlib import Path

from vaswani.config import load_run_config
from vaswani.devices import cpu_generation, cpu_name

METRICS = {"translation": ["bleu", "chrf"], "lm": ["loss", "bits_per_char"],
           "classification": ["accuracy", "macro_f1"]}
DIGITS = {"bleu": 2, "chrf": 2, "loss": 3, "bits_per_char": 3, "accuracy": 4, "macro_f1": 3}


def parse_axis(text: str) -> tuple[str, list[str]]:
    """``section.key=v1,v2`` -> (``section.key``, [v1, v2])."""
    key, sep, values = text.partition("=")
    if not sep or "." not in key or not values:
        raise argparse.ArgumentTypeError(f"--axis {text!r}: expected section.key=v1,v2,... "
                                         "(e.g. train.lr=1e-3,2e-3)")
    return key, values.split(",")


def points(axes: list[tuple[str, list[str]]]) -> list[dict[str, str]]:
    """Every combination of the axes' values, the first axis varying slowest."""
    keys = [k for k, _ in axes]
    return [dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(values for _, values in axes))]


def point_name(point: dict[str, str]) -> str:
    """A directory name for a point: ``optimizer-muon_lr-2e-3`` (``base`` for no axes)."""
    parts = [f"{key.split('.')[-1]}-{value}" for key, value in point.items()]
    return "_".join(parts).replace("/", "-") or "base"


def budget_sets(steps: int | None, minutes: float | None) -> list[str]:
    """The ``--set``s of the budget: one evaluation, at the end.

    Fixed work also turns off the config's own time budget (a preset's ``max_minutes``),
    which would otherwise stop a slow point early and re-plan its schedule: the same steps
    on every point, whatever else the machine is doing."""
    if minutes:
        return [f"train.max_minutes={minutes}", "train.max_steps=1000000",
                "train.eval_every=1000000", "train.save_every=1000000"]
    return [f"train.max_steps={steps}", "train.max_minutes=0", f"train.eval_every={steps}",
            f"train.save_every={steps}"]


def run_point(config: Path, out: Path, point: dict[str, str], budget: list[str],
              split: str, beam: int | None, again: bool) -> dict:
    """Train and evaluate one point (or read its result if an earlier sweep did)."""
    run_dir = out / point_name(point)
    result_file = run_dir / "sweep-result.json"
    if result_file.exists() and not again:
        return json.loads(result_file.read_text())
    vaswani = [sys.executable, "-m", "vaswani"]
    sets = [x for key, value in point.items() for x in ("--set", f"{key}={value}")]
    sets += [x for s in budget for x in ("--set", s)]
    train = [*vaswani, "train", str(config), "--out", str(run_dir), "--overwrite",
             "--no-progress", *sets]
    done = subprocess.run(train, stdout=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"training {run_dir} failed (exit {done.returncode}): "
                         f"{' '.join(train)}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    evaluate = [*vaswani, "evaluate", str(run_dir), "--split", split]
    if beam:
        evaluate += ["--beam", str(beam)]
    scored = subprocess.run(evaluate, stdout=subprocess.PIPE, text=True)
    if scored.returncode:
        raise SystemExit(f"scoring {run_dir} failed (exit {scored.returncode}): "
                         f"{' '.join(evaluate)}")
    scores = json.loads(scored.stdout)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r and "valid_loss" not in r]
    valid = [r["valid_loss"] for r in rows if "valid_loss" in r]
    state = json.loads((run_dir / "last" / "state.json").read_text())
    result = {"point": point, "run_dir": str(run_dir), "steps": summary["steps"],
              "minutes": round(state["elapsed"] / 60, 2),
              "tokens_per_s": round(statistics.median(speeds)) if speeds else None,
              "valid_loss": valid[-1] if valid else None,
              "test": {k: v for k, v in scores.items() if isinstance(v, (int, float))},
              "task": scores.get("task"), "train_command": " ".join(train[1:]),
              "evaluate_command": " ".join(evaluate[1:])}
    result_file.write_text(json.dumps(result, indent=2))
    return result


def table(results: list[dict]) -> str:
    """A markdown table: one row per point."""
    axes = list(results[0]["point"]) if results else []
    metrics = METRICS.get(results[0]["task"], []) if results else []
    head = [*(a.split(".")[-1] for a in axes), "steps", "minutes", "tokens/s", "valid loss",
            *(f"test {m}" for m in metrics)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [*(r["point"][a] for a in axes), f"{r['steps']:,}", f"{r['minutes']:.1f}",
                 f"{r['tokens_per_s']:,}" if r["tokens_per_s"] else "-",
                 f"{r['valid_loss']:.3f}" if r["valid_loss"] is not None else "-",
                 *(f"{r['test'][m]:.{DIGITS[m]}f}" if m in r["test"] else "-" for m in metrics)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: python scripts/sweep.py configs/bible-en-es-demo.toml --out "
               "runs/sweep --axis train.optimizer=adamw,muon --steps 1500")
    parser.add_argument("config", type=Path, help="the base config (a TOML file)")
    parser.add_argument("--out", type=Path, required=True,
                        help="folder of the runs, one sub-folder per point")
    parser.add_argument("--axis", type=parse_axis, action="append", default=[],
                        metavar="SECTION.KEY=V1,V2",
                        help="a config key and its values to try (repeat for a grid)")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=int, help="train every point this many steps")
    budget.add_argument("--minutes", type=float,
                        help="train every point for this many minutes of wall-clock")
    parser.add_argument("--split", choices=["valid", "test"], default="test",
                        help="the split scored after training (default test)")
    parser.add_argument("--beam", type=int, help="translation beam (default the config's)")
    parser.add_argument("--again", action="store_true",
                        help="train points again even where a result exists")
    parser.add_argument("--json", type=Path, help="write every result and the machine here")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    args = parser.parse_args(argv)
    if not args.config.is_file():
        parser.error(f"{args.config}: no such config file")
    if args.steps is not None and args.steps <= 0 or args.minutes is not None and args.minutes <= 0:
        parser.error("--steps and --minutes must be positive")
    keys = [key for key, _ in args.axis]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        parser.error(f"--axis {twice[0]} is given more than once: put its values in one, "
                     f"as --axis {twice[0]}=V1,V2")
    if args.split == "test":  # before any training: a sweep that cannot be scored is refused
        data = load_run_config(args.config).data
        if not (data.test or data.dataset):
            parser.error(f"{args.config} names no [data] test files (nor a dataset) to score "
                         "the points on: add them, or pass --split valid")
    grid = points(args.axis)
    budget_set = budget_sets(args.steps, args.minutes)
    results = []
    for i, point in enumerate(grid, 1):
        print(f"[{i}/{len(grid)}] {point_name(point)}", file=sys.stderr, flush=True)
        results.append(run_point(args.config, args.out, point, budget_set, args.split,
                                 args.beam, args.again))
    text = table(results)
    print(text)
    command = "python scripts/sweep.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": command, "cpu": cpu_name(),
                                         "cpu_generation": cpu_generation(),
                                         "results": results}, indent=2))


if __name__ == "__main__":
    main()
