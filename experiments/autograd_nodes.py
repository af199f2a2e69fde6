"""RMSNorm and rotary positions under autograd: nn/'s operators, each a node of autograd's
graph, against one node with its backward pass written out: cpu/norm.py's for RMSNorm (what
a CPU model runs while training), and for the rotation the way not taken, :func:`rotate`.

    python -m experiments.autograd_nodes [--run RUN_DIR] [--rounds 10] [--json OUT.json]

At a LoRA step's shapes (``benchmarks.finetune``'s batch: 4 x 128 tokens, SmolLM2's 576
numbers, 9 query and 3 key/value heads of 64), forward and backward, alternating, best of
five rounds: an RMSNorm with a frozen weight (a LoRA step's) and one whose weight trains;
the rotation of a layer's queries and keys. Outputs and gradients checked equal first.

:func:`rotate` computes nn/'s ``x cos + rotate_half(x) sin`` (rotate_half(x1, x2) = (-x2, x1):
a chunk, a negation and a concatenation) as ``x cos + roll(x) s``, roll swapping the halves
and s = (-sin1, sin2) carrying the sign (the same bits), backward ``dy cos + roll(dy s)``
(rolling by half the width is its own transpose): four operators each way instead of about
six. It was no faster (docs/performance.md, "RMSNorm as one node"), so nn/'s rotation runs.

With ``--run`` (a LLaMA-family language-model run, such as ``benchmarks.finetune``'s
SmolLM2), a whole LoRA step (q, k, v and o at rank 8, forward and backward, no optimizer)
with nn/'s RMSNorm and with cpu/norm.py's alternating in one process, ``--rounds`` pairs: the
median of the pairs' ratios and each way's best.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from benchmarks.common import report
from experiments.decode_kernels import two_ways, versus_rows


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x`` turned by its angles, one autograd node (the module's text)."""
    return _Rotate.apply(x, cos, signed_sin)


def _roll(x: torch.Tensor) -> torch.Tensor:
    return x.roll(x.size(-1) // 2, dims=-1)  # (x1, x2) -> (x2, x1)


class _Rotate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, signed_sin):
        ctx.save_for_backward(cos, signed_sin)
        return (x * cos + _roll(x) * signed_sin).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        cos, signed_sin = ctx.saved_tensors
        return (grad * cos + _roll(grad * signed_sin)).to(grad.dtype), None, None


def one_node_rotary(head_dim: int):
    """fn(q, k, positions) -> both turned by :func:`rotate`, as nn/'s Rotary(head_dim)."""
    from vaswani.nn.rotary import rope_angles

    def turn(q, k, positions):
        cos, sin = rope_angles(positions, head_dim, 10000.0)
        half = head_dim // 2
        signed_sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        return rotate(q, cos, signed_sin), rotate(k, cos, signed_sin)
    return turn


def _both(forward, inputs: list[torch.Tensor], weights: tuple[torch.Tensor, ...] = ()):
    """fn(_) -> the gradients of the outputs' sum of squares with respect to ``inputs`` and
    to those of ``weights`` that train."""
    def run(_x):
        leaves = [t.detach().requires_grad_() for t in inputs]
        outs = forward(*leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        trained = [w for w in weights if w.requires_grad]
        return torch.autograd.grad(sum(o.square().sum() for o in outs), leaves + trained)
    return run


def pieces(rows: int = 512, d: int = 576, heads: tuple[int, int] = (9, 3), head_dim: int = 64,
           repeats: int = 5, calls: int = 20) -> dict:
    """The module's text, first part."""
    from vaswani.cpu.norm import CPURMSNorm
    from vaswani.nn.norm import RMSNorm
    from vaswani.nn.rotary import Rotary

    def same(want, got):
        return all(torch.allclose(g, w, rtol=1e-4, atol=1e-5) for w, g in zip(want, got,
                                                                               strict=True))
    out = {}
    x = torch.randn(rows // 128, 128, d)
    for trains in (False, True):
        norm = RMSNorm(d).requires_grad_(trains)
        out.update(two_ways({f"RMSNorm ({'weight trains' if trains else 'frozen'}), {rows} "
                             f"rows x {d}": x}, "nn", _both(norm, [x], (norm.weight,)),
                            "one_node", _both(CPURMSNorm.of(norm), [x], (norm.weight,)), same,
                            repeats, calls))
    rotary = Rotary(head_dim)
    q = torch.randn(rows // 128, heads[0], 128, head_dim)
    k = torch.randn(rows // 128, heads[1], 128, head_dim)
    positions = torch.arange(128)

    def turned(module):
        return _both(lambda q, k: module(q, k, positions), [q, k])
    out.update(two_ways({f"rotary, q and k ({heads[0]} + {heads[1]} heads of {head_dim}, "
                         f"{rows} rows)": q}, "nn", turned(rotary), "one_node",
                        turned(one_node_rotary(head_dim)), same, repeats, calls))
    return out


def lora_step(run_dir: Path, rounds: int, length: int = 128) -> dict:
    """The module's text, second part."""
    from benchmarks.finetune import TARGETS, batches
    from vaswani import checkpoint, rundir
    from vaswani.config import FinetuneConfig
    from vaswani.cpu.norm import CPURMSNorm
    from vaswani.models import build_model
    from vaswani.models.finetune import add_adapters
    from vaswani.models.head_loss import head_cross_entropy
    from vaswani.nn.norm import RMSNorm

    torch.manual_seed(0)
    model = build_model(rundir.read_config(run_dir).model, initialise=False)
    checkpoint.load_weights(model, run_dir / rundir.BEST)
    add_adapters(model, FinetuneConfig(method="lora", rank=8, alpha=16.0, targets=TARGETS))
    model.train()
    ids = torch.tensor(batches(run_dir, 1, 4, length)[0])
    target = ids[:, 1:].flatten()
    ways = {"nn": RMSNorm.forward, "one_node": CPURMSNorm.forward}

    def step(way: str) -> tuple[float, float]:
        CPURMSNorm.forward = ways[way]  # restored below
        try:
            start = time.perf_counter()
            loss_sum, _, count = model(ids[:, :-1], mask=True,
                                       loss=partial(head_cross_entropy, target=target))
            (loss_sum / count).backward()
            seconds = time.perf_counter() - start
        finally:
            CPURMSNorm.forward = ways["one_node"]
        model.zero_grad(set_to_none=True)
        return seconds, (loss_sum / count).item()

    times: dict[str, list[float]] = {way: [] for way in ways}
    losses = {way: step(way)[1] for way in ways}  # (and a first, untimed step each)
    for _ in range(rounds):
        for way in ways:
            times[way].append(step(way)[0])
    ratios = [a / b for a, b in zip(times["nn"], times["one_node"], strict=True)]
    return {"run": str(run_dir), "pairs": rounds,
            "nn_best_s": round(min(times["nn"]), 3),
            "one_node_best_s": round(min(times["one_node"]), 3),
            "nn_over_one_node_median": round(statistics.median(ratios), 3),
            "ratios": [round(r, 3) for r in ratios], "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="a LLaMA-family run: also time a LoRA step")
    parser.add_argument("--rounds", type=int, default=10, help="pairs of LoRA steps")
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    timed = pieces()
    rows = versus_rows(timed, "nn", "one_node")
    result = {"pieces": timed}
    if args.run:
        step = result["lora_step"] = lora_step(args.run, args.rounds)
        rows.append(("a LoRA step, median of pairs", f"{step['nn_over_one_node_median']}x "
                     f"(best {step['nn_best_s']} s / {step['one_node_best_s']} s)"))
    report("RMSNorm and rotary under autograd: nn/ / one node", rows, result, args.json)


if __name__ == "__main__":
    main()
