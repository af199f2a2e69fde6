"""Attention cost vs sequence length: time and peak memory of one forward + backward.

    python -m benchmarks.scaling [--quick] [--dtype fp32|bf16] [--json OUT.json] [--plot OUT.png]

One vaswani encoder layer (d_model 256, 4 heads, d_ff 1024, no dropout; fp32, or bf16
autocast) over a batch of one sequence of length 128 .. 4096, with the written-out
``reference`` attention (which materialises the (T, T) weights of every head) and with the
``sdpa`` backend (PyTorch's fused kernel, which never does). Memory is the process's peak
resident set (VmHWM), measured in a fresh subprocess per point so that one point
cannot hide inside another's freed pages; the reference path's (T, T) weights per head make
it grow quadratically, SDPA's linearly.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

LENGTHS = [128, 256, 512, 1024, 2048, 4096]
D, HEADS, D_FF = 256, 4, 1024

_CHILD = rf"""
import json, sys, time
import torch
from vaswani.devices import peak_resident_bytes
from vaswani.nn import (Attention, EncoderLayer, FeedForward, Heads, LayerNorm,
                        MultiHeadAttention, Residual)
T, backend, bf16 = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "bf16"
torch.manual_seed(0)
layer = EncoderLayer(MultiHeadAttention(Heads({D}, {HEADS}), Attention(backend=backend)),
                     FeedForward({D}, {D_FF}), lambda: Residual(LayerNorm({D}), norm_first=True))
x = torch.randn(1, T, {D}, requires_grad=True)
mask = torch.ones(1, 1, 1, T, dtype=torch.bool)
def step():
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out, _ = layer(x, mask=mask)
    out.float().sum().backward()
step()  # warm-up; allocator and kernels ready
base = peak_resident_bytes() / 1024
times = []
for _ in range(3):
    start = time.perf_counter(); step(); times.append(time.perf_counter() - start)
peak = peak_resident_bytes() / 1024
print(json.dumps({{"seconds": min(times), "rss_peak_mib": peak / 1024,
                  "rss_before_mib": base / 1024}}))
"""


def measure(T: int, backend: str, dtype: str) -> dict:
    """Run one point in a fresh process (ru_maxrss is a high-water mark per process)."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(T), backend, dtype], check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="lengths up to 2048")
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    parser.add_argument("--plot", metavar="PNG", help="also draw time and memory vs length")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    args = parser.parse_args()
    lengths = LENGTHS[:-1] if args.quick else LENGTHS
    rows = []
    for T in lengths:
        for backend in ("reference", "sdpa"):
            r = measure(T, backend, args.dtype)
            rows.append({"length": T, "backend": backend, **r})
            print(f"T={T:5d} {backend:9s} {r['seconds'] * 1e3:8.1f} ms  "
                  f"peak RSS {r['rss_peak_mib']:7.0f} MiB", flush=True)
    print("\n| length | reference ms | sdpa ms | reference peak MiB | sdpa peak MiB |")
    print("|---|---|---|---|---|")
    by = {(r["length"], r["backend"]): r for r in rows}
    for T in lengths:
        ref, sdpa = by[T, "reference"], by[T, "sdpa"]
        print(f"| {T} | {ref['seconds'] * 1e3:.1f} | {sdpa['seconds'] * 1e3:.1f} | "
              f"{ref['rss_peak_mib']:.0f} | {sdpa['rss_peak_mib']:.0f} |")
    if args.json:
        from .common import hardware
        Path(args.json).write_text(json.dumps({"points": rows, "d_model": D, "heads": HEADS,
                                               "dtype": args.dtype,
                                               "hardware": hardware()}, indent=2))
        print(f"\nwrote {args.json}")
    if args.plot:
        plot(rows, lengths, args.plot, args.dtype)
        print(f"wrote {args.plot}")


def plot(rows: list[dict], lengths: list[int], path: str, dtype: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    for backend, style in (("reference", "o-"), ("sdpa", "s-")):
        pts = [r for r in rows if r["backend"] == backend]
        ax_t.plot([r["length"] for r in pts], [r["seconds"] * 1e3 for r in pts], style,
                  label=backend)
        ax_m.plot([r["length"] for r in pts], [r["rss_peak_mib"] for r in pts], style,
                  label=backend)
    for ax, title in ((ax_t, "forward + backward (ms)"), (ax_m, "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths, [str(T) for T in lengths])
        ax.set_xlabel("sequence length")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"One encoder layer, d_model {D}, {HEADS} heads, batch 1, {dtype}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
