"""Muon's update with its Newton-Schulz iteration in bf16 (PyTorch's) and in float32.

    python -m experiments.muon [--presets copy-task,bible-en-es-demo] [--json OUT.json]
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m experiments.muon   # AVX2 kernels

One Muon step over the layers' matrices of each preset's model (fixed random gradients),
the two iterations timed in alternation, best of ``--repeats``; then each iteration alone,
the matrices of one shape stacked (what the step does) against one matrix at a time.
``make_optimizer`` runs the iteration in bf16 where the device multiplies bf16 natively and
in float32 elsewhere: on a CPU without AVX512-BF16 or AMX, PyTorch emulates bf16 matrix
products. The second command above has PyTorch and oneDNN use only their AVX2 kernels, as
on such a CPU.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import interleaved_best, preset_model, ratio, report
from vaswani import build_model
from vaswani.training.optimizers import Muon, hidden_matrices, orthogonalize, orthogonalize_all


def muon_step(matrices: list[torch.nn.Parameter], dtype: torch.dtype):
    """A call that takes one Muon step over ``matrices`` (their gradients set), the iteration
    in ``dtype``; each call's optimizer keeps its own momentum."""
    opt = Muon(matrices, lr=1e-4, weight_decay=0.0, ortho_dtype=dtype)
    return opt.step


def iteration(updates: list[torch.Tensor], dtype: torch.dtype, stacked: bool):
    """A call that orthogonalizes ``updates`` with Muon's defaults, stacked by shape or not."""
    muon = torch.optim.Muon([torch.nn.Parameter(torch.zeros(1, 1))]).defaults
    ns = muon["ns_coefficients"], muon["ns_steps"], muon["eps"], dtype
    if stacked:
        return lambda: orthogonalize_all(updates, *ns)
    return lambda: [orthogonalize(u, *ns) for u in updates]


def measure(preset: str, repeats: int) -> dict:
    torch.manual_seed(0)
    model = build_model(preset_model(preset, vocab_size=1000))
    matrices = hidden_matrices(model)
    for p in matrices:
        p.grad = torch.randn_like(p)
    bf16, fp32 = interleaved_best([muon_step(matrices, torch.bfloat16),
                                   muon_step(matrices, torch.float32)], repeats)
    result = {"matrices": len(matrices), "shapes": len({p.shape for p in matrices}),
              "numbers": sum(p.numel() for p in matrices),
              "bf16_ms": round(bf16 * 1e3, 2), "float32_ms": round(fp32 * 1e3, 2),
              "bf16_over_float32": ratio(bf16, fp32)}
    updates = [p.grad for p in matrices]
    for name, dtype in [("bf16", torch.bfloat16), ("float32", torch.float32)]:
        stacked, alone = interleaved_best([iteration(updates, dtype, True),
                                           iteration(updates, dtype, False)], repeats)
        result[f"{name}_iteration_stacked_ms"] = round(stacked * 1e3, 2)
        result[f"{name}_iteration_one_by_one_ms"] = round(alone * 1e3, 2)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="copy-task,bible-en-es-demo",
                        help="configs/NAME.toml models, comma-separated")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)
    results = {name: measure(name, args.repeats) for name in args.presets.split(",")}
    rows = []
    for name, r in results.items():
        rows += [(f"{name}: {r['matrices']} matrices, bf16 iteration", f"{r['bf16_ms']} ms"),
                 (f"{name}: float32 iteration", f"{r['float32_ms']} ms"),
                 (f"{name}: bf16 / float32", f"{r['bf16_over_float32']}x")]
        for dtype in ("bf16", "float32"):
            rows += [(f"{name}: the {dtype} iteration alone, {r['shapes']} shapes stacked",
                      f"{r[f'{dtype}_iteration_stacked_ms']} ms"),
                     (f"{name}: the {dtype} iteration, one matrix at a time",
                      f"{r[f'{dtype}_iteration_one_by_one_ms']} ms")]
    report(f"A Muon step, PyTorch CPU kernels {torch.backends.cpu.get_cpu_capability()}", rows,
           {"results": results}, args.json)  # the kernels: hardware's cpu_capability


if __name__ == "__main__":
    main()
