"""vaswani's shakespeare-char preset against nanoGPT's CPU recipe, for the same wall-clock time.

    python -m benchmarks.nanogpt --nanogpt PATH/TO/nanoGPT [--minutes 10] [--rounds 1]
        [--work runs/nanogpt-compare] [--json docs/results/bench-nanogpt.json] [--set K=V ...]

nanoGPT's source is not part of this repository: give a checkout of
https://github.com/karpathy/nanoGPT (its train.py, model.py and configurator.py are run as they
are, unmodified). What is compared:

- the data: both train on vaswani's Shakespeare training split (38 plays) encoded with one
  character vocabulary; it is written as nanoGPT's train.bin / val.bin / meta.pkl.
- nanoGPT: the recipe its README gives for CPUs (config/train_shakespeare_char.py with block 64,
  batch 12, 4 layers, 4 heads, 128 wide, no dropout, lr decayed over the run, no compile). It
  has no time budget, so a short calibration run (or ``--nanogpt-ms``) gives its milliseconds
  per iteration here and the real run gets ``minutes / that`` iterations, with
  ``lr_decay_iters`` equal to them; later rounds plan with the previous round's measured speed.
  Its evaluations are cut to the start and the end. Its true training time is reported.
- vaswani: ``vaswani train configs/shakespeare-char.toml --set train.max_minutes=MINUTES``
  (the schedule follows the budget), plus any ``--set``.
- one evaluator: the same consecutive, non-overlapping windows of the held-out valid plays
  (Julius Caesar, The Tempest), as long as the shorter context of the two (64 characters),
  every character after the first of a window scored once; nats per character. vaswani's own
  evaluation at its full context (``vaswani evaluate``) is reported beside it.
- rounds alternate who trains first, so a change in machine load falls on both.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import pickle
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vaswani.data.batching import lm_eval_windows
from vaswani.data.prepare import prepared_files
from vaswani.data.registry import default_cache
from vaswani.data.tokenizers import CharTokenizer

from .common import ROOT, hardware

DATASET = "vaswani_shakespeare"   # the folder under nanoGPT's data/
# nanoGPT's README, "I only have a macbook": its CPU recipe.
NANOGPT_RECIPE = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
                  "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12",
                  "--n_layer=4", "--n_head=4", "--n_embd=128", "--dropout=0.0"]
NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config")


# --- data ----------------------------------------------------------------------------------

def write_nanogpt_data(train_text: str, valid_text: str, dest: Path) -> CharTokenizer:
    """nanoGPT's data format (uint16 ids in train.bin / val.bin, meta.pkl with vocab_size)
    from vaswani's character vocabulary of the training text; returns that tokenizer."""
    tok = CharTokenizer.train([train_text])
    dest.mkdir(parents=True, exist_ok=True)
    for name, text in (("train.bin", train_text), ("val.bin", valid_text)):
        np.asarray(tok.encode(text), dtype=np.uint16).tofile(dest / name)
    meta = {"vocab_size": tok.vocab_size, "itos": dict(enumerate(tok.itos)), "stoi": tok.stoi}
    (dest / "meta.pkl").write_bytes(pickle.dumps(meta))
    return tok


# --- the evaluator -------------------------------------------------------------------------

@torch.no_grad()
def nats_per_char(logits_of, ids: list[int], window: int, batch: int = 64) -> dict:
    """Mean next-character loss over consecutive non-overlapping windows of ``window``
    characters (the windows ``vaswani evaluate`` reads): ``logits_of(x)`` maps (B, T) ids to
    (B, T, V) logits. Full windows go in batches; a shorter last window on its own."""
    pieces = list(lm_eval_windows(np.asarray(ids, dtype=np.int64), window))
    total, count = 0.0, 0
    for start in range(0, len(pieces), batch):
        group = pieces[start: start + batch]
        by_len: dict[int, list] = {}
        for x, y in group:
            by_len.setdefault(x.shape[1], []).append((x, y))
        for same in by_len.values():
            x = torch.cat([p[0] for p in same])
            y = torch.cat([p[1] for p in same])
            logits = logits_of(x).float()
            total += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"))
            count += y.numel()
    return {"nats_per_char": total / count, "characters": count, "windows": len(pieces),
            "window": window}


def load_nanogpt(checkout: Path, ckpt_path: Path):
    """nanoGPT's GPT from its own model.py, with the weights its train.py saved."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", checkout / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    GPT, GPTConfig = module.GPT, module.GPTConfig
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    state = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    model.load_state_dict(state)
    model.eval()
    return model, ckpt


def nanogpt_logits(model):
    # With targets given, nanoGPT's forward returns logits at every position.
    return lambda x: model(x, x)[0]


def vaswani_logits(model):
    return lambda x: model(x, mask=torch.ones_like(x, dtype=torch.bool))


# --- the two contenders ----------------------------------------------------------------------

ITER_TIME = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", re.M)


def ms_per_iter(log: str, skip: int = 10) -> float:
    """Median milliseconds per iteration from nanoGPT's log lines, past the first ``skip``."""
    times = [float(ms) for it, ms in ITER_TIME.findall(log) if int(it) >= skip]
    if not times:
        raise RuntimeError("no 'iter N: loss L, time Tms' lines in nanoGPT's output")
    return statistics.median(times)


def nanogpt_workdir(checkout: Path, data: Path, work: Path) -> Path:
    """A folder where nanoGPT's train.py runs as in its checkout (links to its files) with
    our data as data/vaswani_shakespeare; the checkout itself is left untouched."""
    for name in NANOGPT_FILES:
        if not (checkout / name).exists():
            raise SystemExit(f"{checkout} is not a nanoGPT checkout: no {name}")
    work.mkdir(parents=True, exist_ok=True)
    for name in NANOGPT_FILES:
        link = work / name
        if not link.exists():
            link.symlink_to((checkout / name).resolve())
    (work / "data").mkdir(exist_ok=True)
    link = work / "data" / DATASET
    if not link.exists():
        link.symlink_to(data.resolve())
    return work


def run_nanogpt(work: Path, iters: int, out_dir: str, log_path: Path) -> tuple[float, str]:
    args = [sys.executable, "train.py", *NANOGPT_RECIPE, f"--dataset={DATASET}",
            "--dtype=float32", f"--max_iters={iters}", f"--lr_decay_iters={iters}",
            f"--eval_interval={iters}", "--always_save_checkpoint=True", f"--out_dir={out_dir}"]
    start = time.perf_counter()
    done = subprocess.run(args, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    seconds = time.perf_counter() - start
    log_path.write_text(done.stdout)
    if done.returncode:
        raise SystemExit(f"nanoGPT failed (exit {done.returncode}); its output: {log_path}")
    return seconds, done.stdout


def calibrate_nanogpt(work: Path, iters: int = 150) -> float:
    _, log = run_nanogpt(work, iters, "out-calibration", work / "calibration.log")
    return ms_per_iter(log)


def train_nanogpt(checkout: Path, work: Path, minutes: float, ms: float, ids: list[int],
                  window: int, round_: int) -> dict:
    iters = max(1, int(minutes * 60_000 / ms))
    out_dir = f"out-round{round_}"
    print(f"nanoGPT: {iters:,} iterations (planned at {ms:.1f} ms each)", flush=True)
    seconds, log = run_nanogpt(work, iters, out_dir, work / f"round{round_}.log")
    model, ckpt = load_nanogpt(checkout, work / out_dir / "ckpt.pt")
    score = nats_per_char(nanogpt_logits(model), ids, window)
    params = sum(p.numel() for p in model.parameters())
    train_s = sum(float(ms) for _, ms in ITER_TIME.findall(log)) / 1000
    return {"wall_s": round(seconds, 1), "train_s": round(train_s, 1),
            "steps": int(ckpt["iter_num"]),
            "characters_seen": int(ckpt["iter_num"]) * ckpt["config"]["batch_size"]
            * ckpt["config"]["block_size"],
            "parameters": params,
            "eval": score, "nanogpt_own_val_loss": float(ckpt["best_val_loss"])}


def train_vaswani(work: Path, minutes: float, sets: list[str], ids: list[int], window: int,
                  valid_path: Path, round_: int) -> dict:
    import vaswani
    from vaswani import rundir
    run_dir = work / f"vaswani-round{round_}"
    cmd = [sys.executable, "-m", "vaswani", "train", "configs/shakespeare-char.toml",
           "--out", str(run_dir), "--overwrite", "--no-progress",
           "--set", f"train.max_minutes={minutes}", *[x for s in sets for x in ("--set", s)]]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"vaswani train failed (exit {done.returncode})")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    run = vaswani.load(run_dir)
    if run.source_tokenizer.encode(valid_path.read_text()) != ids:
        raise SystemExit("the vaswani run's character vocabulary differs from the shared one")
    score = nats_per_char(vaswani_logits(run.model), ids, window)
    own = run.evaluate([str(valid_path)])  # = vaswani evaluate RUN --split valid
    d = run.config.data
    train_s = max(m.get("elapsed", 0) for m in rundir.read_metrics(run_dir / rundir.METRICS))
    return {"wall_s": round(seconds, 1), "train_s": train_s,
            "steps": int(summary["steps"]),
            "characters_seen": int(summary["steps"]) * d.batch_size * d.block_size,
            "parameters": sum(p.numel() for p in run.model.parameters()),
            "eval": score, "vaswani_own_eval": own, "command": " ".join(cmd[2:])}


# --- main ----------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanogpt", required=True, type=Path, metavar="CHECKOUT",
                        help="a checkout of github.com/karpathy/nanoGPT")
    parser.add_argument("--minutes", type=float, default=10.0, help="training time for each")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat, alternating who trains first (default 1)")
    parser.add_argument("--vaswani-first", action="store_true",
                        help="vaswani trains first in odd rounds (default: nanoGPT first)")
    parser.add_argument("--nanogpt-ms", type=float, metavar="MS",
                        help="nanoGPT's milliseconds per iteration here, instead of calibrating "
                             "(the machine's speed drifts by +-15%% over minutes; a round's "
                             "measured mean is the best figure for the next)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "nanogpt-compare")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to vaswani train (e.g. model.d_model=192)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()

    files = prepared_files("shakespeare", default_cache())
    train_text, valid_text = files["train"].read_text(), files["valid"].read_text()
    data = args.work / "data"
    tok = write_nanogpt_data(train_text, valid_text, data)
    ids = tok.encode(valid_text)
    work = nanogpt_workdir(args.nanogpt, data, args.work / "nanogpt")
    window = 64  # nanoGPT's CPU recipe reads 64 characters; vaswani's preset 128

    ms = args.nanogpt_ms or calibrate_nanogpt(work)
    first_ms = ms
    rounds = []
    for r in range(args.rounds):
        order = ["nanogpt", "vaswani"] if (r + args.vaswani_first) % 2 == 0 else \
            ["vaswani", "nanogpt"]
        result = {"order": order}
        for who in order:
            print(f"round {r + 1}/{args.rounds}: training {who} for {args.minutes} min",
                  flush=True)
            if who == "nanogpt":
                result[who] = train_nanogpt(args.nanogpt, work, args.minutes, ms, ids, window,
                                            r)
                # later rounds plan with this round's measured speed
                ms = 1000 * result[who]["train_s"] / max(1, result[who]["steps"])
            else:
                result[who] = train_vaswani(args.work, args.minutes, args.set, ids, window,
                                            files["valid"], r)
            print(f"  {who}: {result[who]['eval']['nats_per_char']:.4f} nats/char", flush=True)
        rounds.append(result)

    def mean(who, key):
        return statistics.mean(x[who][key] if key != "eval" else x[who]["eval"]["nats_per_char"]
                               for x in rounds)

    summary = {who: {"nats_per_char": mean(who, "eval"), "wall_s": mean(who, "wall_s"),
                     "train_s": mean(who, "train_s"), "steps": mean(who, "steps")}
               for who in ("nanogpt", "vaswani")}
    summary["vaswani_minus_nanogpt"] = (summary["vaswani"]["nats_per_char"]
                                        - summary["nanogpt"]["nats_per_char"])
    print(f"\n### vaswani vs nanoGPT, {args.minutes:g} minutes each, {args.rounds} round(s)\n")
    print("| | nanoGPT CPU recipe | vaswani shakespeare-char |\n|---|---|---|")
    print(f"| valid nats/char (window {window}) | {summary['nanogpt']['nats_per_char']:.4f} | "
          f"{summary['vaswani']['nats_per_char']:.4f} |")
    print(f"| wall time (s) | {summary['nanogpt']['wall_s']:.0f} | "
          f"{summary['vaswani']['wall_s']:.0f} |")
    print(f"| training time (s) | {summary['nanogpt']['train_s']:.0f} | "
          f"{summary['vaswani']['train_s']:.0f} |")
    print(f"| steps | {summary['nanogpt']['steps']:,.0f} | {summary['vaswani']['steps']:,.0f} |")
    print(f"| parameters | {rounds[0]['nanogpt']['parameters']:,} | "
          f"{rounds[0]['vaswani']['parameters']:,} |")
    print(f"\nvaswani - nanoGPT: {summary['vaswani_minus_nanogpt']:+.4f} nats/char "
          f"({math.exp(-summary['vaswani_minus_nanogpt']):.3f}x the per-character likelihood)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"minutes": args.minutes, "rounds": rounds, "summary": summary,
             "nanogpt_ms_per_iter_planned": first_ms, "nanogpt_recipe": NANOGPT_RECIPE,
             "vaswani_sets": args.set, "hardware": hardware()}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
