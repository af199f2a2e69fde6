"""Training-step speed: vaswani vs torch.nn.Transformer vs a tutorial-style implementation.

    python -m benchmarks.train_step [--quick] [--json OUT.json]
    python -m benchmarks.train_step --profile bf16 [--json OUT.json]

All three train the same encoder-decoder (d_model 512, 8 heads, d_ff 2048, 3+3 pre-LN layers,
vocabulary 8000, dropout 0.1, tied sinusoidal embeddings) on the same random batches of
32 x 64 source and 32 x 64 target tokens, with the same label-smoothed loss and AdamW. A step
is forward, loss, backward, gradient clipping and the optimizer update, timed after warm-up
steps, the three implementations taking turns in blocks of steps (so that the machine's load
changes the same way for all three; :func:`time_steps`); the median over the timed steps is
reported as target tokens per second, in fp32 and in bf16 autocast.

MFU (model FLOPs utilisation) = the step's matmul FLOPs (counted by
``torch.utils.flop_counter`` on the plain-matmul implementation) / step time / the peak of a
large square matmul measured in the same process and dtype.

``--only vaswani compiled torch`` adds vaswani's step under ``torch.compile`` (the model's
forward compiled, as ``[train] compile = true`` does; its warm-up steps compile).

``--profile fp32|bf16`` only profiles vaswani's step (torch.profiler, 3 steps after 2): the
share of its time in matrix products, in dtype casts (autocast's), in dropout's random
numbers and in the rest, the eight largest operators other than the products, and the
matrix products' own GFLOP/s against the peak: how much higher the step's MFU could go if
everything else took no time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from vaswani import ModelConfig, build_model
from vaswani.devices import bf16_is_fast
from vaswani.models.losses import smoothed_cross_entropy
from vaswani.training.optimizers import make_optimizer

from .baselines import NaiveTransformer, TorchTransformer
from .common import matmul_peak_gflops, report

D, HEADS, D_FF, LAYERS, VOCAB, DROPOUT = 512, 8, 2048, 3, 8000, 0.1
BATCH, SRC_LEN, TGT_LEN = 32, 64, 64


def vaswani_model() -> torch.nn.Module:
    return build_model(ModelConfig(
        arch="encoder-decoder", d_model=D, n_heads=HEADS, d_ff=D_FF, n_layers=LAYERS,
        vocab_size=VOCAB, dropout=DROPOUT, norm_first=True, share_embeddings=True,
        tie_embeddings=True, max_len=512))


BUILDERS = {
    "vaswani": vaswani_model,
    "compiled": vaswani_model,  # vaswani's step with torch.compile, as `[train] compile = true`
    "torch": lambda: TorchTransformer(VOCAB, D, HEADS, D_FF, LAYERS, DROPOUT),
    "naive": lambda: NaiveTransformer(VOCAB, D, HEADS, D_FF, LAYERS, DROPOUT),
}


DEFAULT = ["vaswani", "torch", "naive"]


def batches(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random token batches; tgt has one extra token (input tgt[:-1], target tgt[1:])."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(4, VOCAB, (BATCH, SRC_LEN), generator=g),
             torch.randint(4, VOCAB, (BATCH, TGT_LEN + 1), generator=g)) for _ in range(n)]


def loss_of(model, src, tgt):
    logits = model(src, tgt[:, :-1])
    loss, _, n = smoothed_cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(),
                                        smoothing=0.1, pad_id=0)
    return loss / n


def make_step(name: str, bf16: bool):
    torch.manual_seed(0)
    model = BUILDERS[name]().train()
    if name in ("vaswani", "compiled"):  # the library's own optimizer set-up
        from vaswani.config import TrainConfig
        opt = make_optimizer(model, TrainConfig(lr=1e-4))
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    forward = torch.compile(model) if name == "compiled" else model  # as training/loop.py

    def step(src, tgt) -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(forward, src, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    return step


def time_steps(steps: dict, data, warmup: int, rounds: int, per_round: int
               ) -> dict[str, float]:
    """Median seconds per step of each named step function, the functions taking turns in
    blocks: after ``warmup`` steps each, ``rounds`` rounds in which each function takes one
    untimed step and then ``per_round`` timed ones, all on the same batches in the same
    order. Turns, so that a change in the machine's load falls on all of them alike; blocks,
    because a step right after another model's runs in that model's memory (glibc sizes its
    heap from the blocks freed last), not in its own as in training: the untimed step
    takes that."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        for src, tgt in data[:warmup]:
            step(src, tgt)
    for r in range(rounds):
        block = data[warmup + r * (1 + per_round):][:1 + per_round]
        for name, step in steps.items():
            for i, (src, tgt) in enumerate(block):
                start = time.perf_counter()
                step(src, tgt)
                if i > 0:
                    times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def step_flops() -> float:
    """Matmul FLOPs of one forward + backward, counted on the plain-matmul implementation."""
    torch.manual_seed(0)
    model = NaiveTransformer(VOCAB, D, HEADS, D_FF, LAYERS, 0.0)
    src, tgt = batches(1)[0]
    with FlopCounterMode(display=False) as counter:
        loss_of(model, src, tgt).backward()
    return float(counter.get_total_flops())


KINDS = {"matrix products": ("aten::mm", "aten::addmm", "aten::bmm"),
         "dtype casts": ("aten::copy_",), "dropout's random numbers": ("aten::random_",)}


def profile_step(precision: str, steps: int = 3) -> dict:
    """Shares of vaswani's step time by kind of operator (:data:`KINDS`), self CPU time."""
    from torch.profiler import profile

    step = make_step("vaswani", precision == "bf16")
    data = batches(2 + steps)
    for src, tgt in data[:2]:
        step(src, tgt)
    with profile() as prof:
        for src, tgt in data[2:]:
            step(src, tgt)
    self_us = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(self_us.values())
    shares = {kind: sum(self_us.get(op, 0.0) for op in ops) / total
              for kind, ops in KINDS.items()}
    shares["the rest"] = 1.0 - sum(shares.values())
    others = sorted((op for op in self_us if op not in KINDS["matrix products"]),
                    key=lambda op: -self_us[op])
    matmul_s = shares["matrix products"] * total / 1e6
    peak = matmul_peak_gflops(torch.bfloat16 if precision == "bf16" else torch.float32)
    return {"precision": precision, "shares": shares, "peak_gflops": peak,
            "matmul_gflops": step_flops() * steps / matmul_s / 1e9,
            "largest_others": {op: self_us[op] / total for op in others[:8]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (about a minute)")
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    parser.add_argument("--only", nargs="+", choices=list(BUILDERS), default=DEFAULT,
                        help="the implementations to time (default: %(default)s; `compiled` "
                             "is vaswani's step under torch.compile, whose warm-up compiles "
                             "for about a minute per precision)")
    parser.add_argument("--profile", choices=["fp32", "bf16"],
                        help="only profile vaswani's step in this precision")
    args = parser.parse_args()
    if args.profile:
        found = profile_step(args.profile)
        rows = [(kind, f"{share:.1%}") for kind, share in found["shares"].items()]
        rows += [(f"operator `{op}`", f"{share:.1%}")
                 for op, share in found["largest_others"].items()]
        rows.append(("matrix products' own speed", f"{found['matmul_gflops']:.0f} GFLOP/s = "
                     f"{found['matmul_gflops'] / found['peak_gflops']:.0%} of the peak "
                     f"({found['peak_gflops']:.0f})"))
        report(f"Where vaswani's {args.profile} training step goes (self CPU time)", rows,
               found, args.json)
        return
    warmup, rounds, per_round = (2, 2, 2) if args.quick else (3, 3, 3)
    data = batches(warmup + rounds * (1 + per_round))
    flops = step_flops()
    # bf16 where this CPU has it natively; emulated (an AVX2 CPU) it runs tens of times slower
    # than fp32 and measures the emulation, not vaswani
    precisions = ("fp32", "bf16") if bf16_is_fast(torch.device("cpu")) else ("fp32",)
    peak = {p: matmul_peak_gflops(torch.bfloat16 if p == "bf16" else torch.float32)
            for p in precisions}
    results: dict = {"shape": f"d{D} h{HEADS} ff{D_FF} {LAYERS}+{LAYERS} V{VOCAB} "
                              f"B{BATCH} S{SRC_LEN} T{TGT_LEN} dropout {DROPOUT}",
                     "step_gflop": flops / 1e9, "fp32_peak_gflops": peak["fp32"],
                     "bf16_peak_gflops": peak.get("bf16")}
    rows = []
    if "bf16" not in precisions:
        print("no native bf16 on this CPU: the bf16 rows are skipped", flush=True)
        rows.append(("bf16", "skipped: no native bf16 on this CPU (emulated, far slower)"))
    tokens = BATCH * TGT_LEN
    for precision in precisions:
        steps = {name: make_step(name, precision == "bf16") for name in args.only}
        medians = time_steps(steps, data, warmup, rounds, per_round)
        del steps  # the models and optimizer states of this precision
        for name in args.only:
            seconds = medians[name]
            tok_s = tokens / seconds
            mfu = flops / seconds / 1e9 / peak[precision]
            results[f"{name}_{precision}_tok_s"] = tok_s
            results[f"{name}_{precision}_mfu"] = mfu
            rows.append((f"{name} {precision}", f"{tok_s:,.0f} tok/s, {seconds * 1e3:.0f} "
                         f"ms/step, MFU {mfu:.1%}"))
            print(f"{name} {precision}: {tok_s:,.0f} tok/s", flush=True)
    for precision in precisions:
        for other in ("torch", "naive", "compiled"):
            if other in args.only and "vaswani" in args.only:
                ours, theirs = (results[f"{n}_{precision}_tok_s"] for n in ("vaswani", other))
                ratio = ours / theirs
                results[f"vaswani_vs_{other}_{precision}"] = ratio
                rows.append((f"vaswani / {other} ({precision})", f"{ratio:.2f}x"))
    rows.append(("matmul peak " + " / ".join(precisions),
                 " / ".join(f"{peak[p]:.0f}" for p in precisions) + " GFLOP/s"))
    rows.append(("FLOPs per step", f"{flops / 1e9:.0f} GFLOP"))
    report("Training step (encoder-decoder, target tokens/s; higher is better)", rows, results,
           args.json)


if __name__ == "__main__":
    main()
