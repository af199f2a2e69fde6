"""The same work on two checkouts of vaswani, each in a process of its own, alternating: a
training step, generation and translation. A change of code shape (nn/'s modules taking
ready-made parts, say) should cost no speed; this measures that it does not, and checks that
both trees give the same outputs from the same run directories.

    python -m benchmarks.trees fe856aa . --work /tmp/trees --json OUT.json

Each side is a folder (a checkout) or a git revision of this repository, written out once into
``--work`` with ``git archive``.

Runs (made once in ``--work``, by this checkout): a translator of the bible-en-es preset's size
and a language model of the shakespeare-char preset's (common.make_runs, effectively random
weights), and SmolLM2-135M imported from its GGUF file (``--no-smollm2`` leaves it out). Each
child puts its tree's ``src`` first on the path and says which ``vaswani`` it imported.
Rows: seconds per call, the best of the rounds; the ratio is the first tree's time over the
second's (above 1: the second is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from .common import ROOT, make_runs, report, smollm2

CHILD = r"""
import hashlib, json, random, sys, time
import torch
import vaswani
from vaswani.models import build_model

work, run, repeats, tree = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if not vaswani.__file__.startswith(tree):
    sys.exit(f"imported {vaswani.__file__}, not this tree's")
def best(fn):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter(); out = fn(); times.append(time.perf_counter() - start)
    return min(times), hashlib.sha256(repr(out).encode()).hexdigest()[:16]
rng = random.Random(0)
words = [w for line in open(f"{work}/text.txt") for w in line.split()][:4000]
texts = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 24))) for _ in range(32)]
model = vaswani.load(run)
rows = {}
if hasattr(model, "translate"):
    rows["translate greedy, 32 sentences"] = best(lambda: model.translate(texts, beam=1))
    rows["translate beam 4, 32 sentences"] = best(lambda: model.translate(texts, beam=4))
    config = model.config.model
    torch.manual_seed(0)
    net = build_model(config).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    n = min(40, config.max_len - 1)  # tokens a row, within the model's positions
    src = torch.randint(4, config.vocab_size, (32, n))
    tgt = torch.randint(4, config.tgt_vocab_size or config.vocab_size, (32, n + 1))
    def step():
        logits = net(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        return round(loss.item(), 4)
    rows["training step, 32 rows"] = best(step)
else:
    prompts = [" ".join(t.split()[:6]) for t in texts[:8]]  # within a char model's 128
    rows["generate 64 tokens, batch 1"] = best(
        lambda: model.generate(prompts[0], max_new_tokens=64, temperature=0))
    rows["generate 64 tokens, 8 prompts"] = best(
        lambda: model.generate_many(prompts, max_new_tokens=64, temperature=0))
print(json.dumps({"vaswani": vaswani.__file__, "rows": rows}))
"""


def checkout(side: str, work: Path) -> Path:
    """``side`` as a folder: itself, or a revision of this repository written out into
    ``work`` (once)."""
    if Path(side).is_dir():
        return Path(side).resolve()
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet",
                            f"{side}^{{commit}}"], capture_output=True, text=True)
    if found.returncode:
        raise SystemExit(f"{side!r} is neither a folder nor a revision of {ROOT}")
    out = work / "trees" / found.stdout.strip()[:12]
    if not (out / "src" / "vaswani").is_dir():
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", found.stdout.strip()],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def child(tree: Path, work: Path, run: Path, repeats: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    done = subprocess.run([sys.executable, "-c", CHILD, str(work), str(run), str(repeats),
                           str(tree / "src")], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: {run.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["rows"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", help="a checkout of vaswani or a revision (the one before)")
    parser.add_argument("second", help="another (the one after; `.`: this checkout)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/vaswani-trees"),
                        help="where the runs are made (once)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds, the order swapped each round (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per child")
    parser.add_argument("--no-smollm2", action="store_true", help="leave SmolLM2 out")
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)
    trees = [checkout(args.first, args.work), checkout(args.second, args.work)]
    runs = make_runs(args.work)
    named = {"translator": runs["translator"], "lm": runs["lm"]}
    if not args.no_smollm2:
        named["smollm2"] = smollm2(args.work)
    best: dict[str, list[float]] = {}
    outputs: dict[str, list[set]] = {}
    for round_ in range(args.rounds):
        order = [0, 1] if round_ % 2 == 0 else [1, 0]
        for name, run in named.items():
            for i in order:
                for row, (seconds, digest) in child(trees[i], args.work, run,
                                                     args.repeats).items():
                    key = f"{name}: {row}"
                    best.setdefault(key, [float("inf")] * 2)
                    best[key][i] = min(best[key][i], seconds)
                    outputs.setdefault(key, [set(), set()])[i].add(digest)
    rows, results = [], {"trees": [str(t) for t in trees], "rounds": args.rounds, "rows": {}}
    for key, (a, b) in best.items():
        same = outputs[key][0] == outputs[key][1] and len(outputs[key][0]) == 1
        rows.append((key, f"{a:.4f} s vs {b:.4f} s, {a / b:.3f}x"
                          f"{'' if same else ', OUTPUTS DIFFER'}"))
        results["rows"][key] = {"first_s": a, "second_s": b, "ratio": a / b,
                                "same_outputs": same}
    report(f"{trees[0]} against {trees[1]}", rows, results, args.json)


if __name__ == "__main__":
    main()
