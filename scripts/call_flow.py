"""How often one ``vaswani train`` goes back into a module it had already left.

A reader following a command through the code opens each function as it is first called.
This script runs ``vaswani train`` on the copy task for a few steps (with an evaluation and a
checkpoint, so every part of a run happens) under ``sys.setprofile``, lists vaswani's
functions in the order they are *first* called, maps each to its module, merges neighbours in
the same module, and counts, per module, how many times the path comes back to it after
leaving it. The lower floors (``nn/``, ``models/``, ``config/``, ``data/``, ``generation/``) are
left out with ``--top-only``, as they are libraries the run calls, not its plot. What runs
while a module is imported (its body, class bodies, default arguments) never counts.

    python scripts/call_flow.py [--top-only] [--show]
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOWER = ("nn", "models", "config", "data", "generation", "evaluation", "viz", "atomic",
         "devices")


def importing(frame) -> bool:
    """Whether this call is a module or class body, or runs while a vaswani module is being
    imported (its code, class bodies, default arguments): not the run's plot."""
    if not frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        return True  # a module's or a class's body
    while frame is not None:
        if (frame.f_code.co_name == "<module>"
                and frame.f_globals.get("__name__", "").startswith("vaswani")):
            return True
        frame = frame.f_back
    return False


def trace_train(work: Path) -> list[str]:
    """The modules of vaswani's functions, in the order of their first call."""
    sys.path.insert(0, str(ROOT / "src"))
    from vaswani.cli import main

    seen: set = set()
    order: list[str] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("vaswani.") or code in seen or importing(frame):
            return
        seen.add(code)
        order.append(module.removeprefix("vaswani."))

    argv = ["train", str(ROOT / "configs" / "copy-task.toml"), "--out", str(work / "run"),
            "--cache", str(work / "cache"), "--no-progress", "--set", "train.max_steps=4",
            "--set", "train.eval_every=2", "--set", "train.save_every=2",
            "--set", "train.log_every=1", "--set", "train.metric_examples=8"]
    sys.setprofile(profile)
    try:
        main(argv)
    finally:
        sys.setprofile(None)
    return order


def returns(order: list[str]) -> tuple[list[str], Counter]:
    """(the path with neighbours merged, {module: times the path came back to it})."""
    path: list[str] = []
    for module in order:
        if not path or path[-1] != module:
            path.append(module)
    back: Counter = Counter()
    for i, module in enumerate(path):
        if module in path[:i]:
            back[module] += 1
    return path, back


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top-only", action="store_true",
                        help="leave out the lower floors (nn, models, config, data, ...)")
    parser.add_argument("--show", action="store_true", help="print the path")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        order = trace_train(Path(tmp))
    if args.top_only:
        order = [m for m in order if m.split(".")[0] not in LOWER]
    path, back = returns(order)
    if args.show:
        print(" -> ".join(path))
    print(f"returns to a module already left: {sum(back.values())}")
    for module, n in back.most_common():
        print(f"  {module:<28} {n}")


if __name__ == "__main__":
    main()
