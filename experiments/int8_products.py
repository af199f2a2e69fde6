"""int8 layers at many rows: vaswani's weight-only product against the int8 x int8 product
that rounding each input row to 8 bits allows. What a prompt's (prefill's) int8 layers and
a step of many rows (eight streams, a speculative pass) could cost.

    python -m experiments.int8_products [--rows 1,8,64,256] [--perplexity RUN_DIR]
                                        [--json OUT.json]

For SmolLM2-135M's layer shapes (out, in), over the same int8 weight (one symmetric scale
per output row, cpu/quantized.py ``WeightOnlyLinear``), alternating, best of ``repeats``:

* ``weight_only``: what ``--quantize int8`` runs, ``_weight_int8pack_mm`` (the input rounded
  to bfloat16, the int8 weight converted to float and summed in float32);
* ``w8a8``: each input row rounded to int8 with a scale of its own (its largest magnitude
  over 127), ``torch._int_mm`` (int8 x int8, summed in int32), then the row's scale and
  the weight's;
* ``float``: ``F.linear`` by the dequantized weight in float32 (what eager float runs);
* ``widened``: the levels widened to bfloat16 times the input in bfloat16, float32 sums,
  each output scaled after (cpu/quantized.py ``widened_product``, what ``--fast-prefill``
  runs in a prefill where the CPU has bfloat16 products).

Beside the times, for each way: whether a row's result is the same bits computed alone and
among the others (the engine's contract for int8: tests/engine/test_runner.py; int32 sums
are exact, so ``w8a8`` keeps it whatever kernel sums them), and its largest difference from
the float product relative to that product's largest magnitude (the rounding it adds).

``--perplexity RUN_DIR`` also scores a language model's held-out text (benchmarks.llm's,
frozen) in float32, with ``--quantize int8`` as it is, and with every int8 layer's product
(the tied head's too) taken the ``w8a8`` way: what rounding the inputs costs in quality.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn.functional as F

from benchmarks.common import interleaved_best, report
from vaswani.cpu.quantized import WeightOnlyLinear, widened_product

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536)]  # SmolLM2: q/o, k/v, up, down
ROWS = (1, 8, 64, 256)


def w8a8(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(N, in) float x times the (out, in) int8 weight: each row of x rounded to int8 with
    its own scale, the products summed in int32, scaled back -> (N, out) float32."""
    x_scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
    qx = (x / x_scale).round().clamp(-127, 127).to(torch.int8)
    return torch._int_mm(qx, qweight.t()).float() * x_scale * scales.float()


def row_alone_as_in_batch(way, x: torch.Tensor) -> bool:
    """Whether the first and last rows of ``way(x)`` are the same bits as ``way`` of each
    row alone."""
    together = way(x)
    return all(torch.equal(way(x[i:i + 1])[0], together[i]) for i in {0, len(x) - 1})


def ways_of(layer: WeightOnlyLinear) -> dict:
    """The four ways to multiply by ``layer``'s int8 weight: (N, in) -> (N, out) float32."""
    weight = layer.dequantized()
    return {"weight_only": lambda x: layer.product(x).float(),
            "w8a8": lambda x: w8a8(x, layer.qweight, layer.scales),
            "float": lambda x: F.linear(x, weight),
            "widened": lambda x: widened_product(x.to(torch.bfloat16), layer.qweight,
                                                 layer.scales)}


def calls_of(way, x: torch.Tensor, calls: int):
    return lambda: [way(x) for _ in range(calls)]


def int8_products(shapes=SHAPES, rows=ROWS, repeats: int = 5, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    out: dict = {"shapes": [list(s) for s in shapes], "rows": list(rows), "results": []}
    for n_out, n_in in shapes:
        ways = ways_of(WeightOnlyLinear(torch.randn(n_out, n_in) / n_in ** 0.5, None, bits=8))
        for m in rows:
            x = torch.randn(m, n_in)
            exact = ways["float"](x)
            row = {"shape": [n_out, n_in], "rows": m}
            calls = max(1, 1024 // m)  # enough calls a timing to be read above the clock
            best = interleaved_best([calls_of(way, x, calls) for way in ways.values()],
                                    repeats)
            for (name, way), seconds in zip(ways.items(), best, strict=True):
                row[f"{name}_us"] = round(seconds / calls * 1e6, 1)
                row[f"{name}_row_alone_as_in_batch"] = row_alone_as_in_batch(way, x)
                row[f"{name}_error"] = float((way(x) - exact).abs().max() /
                                             exact.abs().max())
            for way in ("w8a8", "widened"):
                row[f"{way}_speedup"] = round(row["weight_only_us"] / row[f"{way}_us"], 2)
            out["results"].append(row)
    return out


@contextlib.contextmanager
def inputs_in_int8():
    """Every 8-bit ``WeightOnlyLinear`` multiplies the :func:`w8a8` way while this lasts."""
    product = WeightOnlyLinear.product

    def rounded(self, flat):
        return w8a8(flat.float(), self.qweight, self.scales) if self.bits == 8 else \
            product(self, flat)

    WeightOnlyLinear.product = rounded
    try:
        yield
    finally:
        WeightOnlyLinear.product = product


def perplexities(run_dir: str, text: str) -> dict:
    """``text``'s perplexity under the run in float32, int8 weight-only and int8 x int8."""
    import vaswani

    out = {"float32": vaswani.load(run_dir, compiled=False).score(text)["perplexity"]}
    int8 = vaswani.load(run_dir, quantize="int8", compiled=False)
    out["weight_only"] = int8.score(text)["perplexity"]
    with inputs_in_int8():
        out["w8a8"] = int8.score(text)["perplexity"]
    return {k: round(v, 3) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(map(str, ROWS)),
                        help="rows of each product (default 1,8,64,256)")
    parser.add_argument("--perplexity", metavar="RUN_DIR",
                        help="a language model's run: its held-out perplexity each way too")
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    result = int8_products(rows=tuple(int(r) for r in args.rows.split(",")))
    lines = [(f"{r['shape'][0]} x {r['shape'][1]}, {r['rows']} rows",
              f"weight-only {r['weight_only_us']} us, w8a8 {r['w8a8_us']} us "
              f"({r['w8a8_speedup']}x), float {r['float_us']} us, widened "
              f"{r['widened_us']} us ({r['widened_speedup']}x); rows alone as in the "
              f"batch: {r['weight_only_row_alone_as_in_batch']}, "
              f"{r['w8a8_row_alone_as_in_batch']}, {r['float_row_alone_as_in_batch']}, "
              f"{r['widened_row_alone_as_in_batch']}; error {r['weight_only_error']:.1e}, "
              f"{r['w8a8_error']:.1e}, {r['widened_error']:.1e}")
             for r in result["results"]]
    if args.perplexity:
        from benchmarks.llm import HELD_OUT

        result["perplexity"] = perplexities(args.perplexity, HELD_OUT.read_text())
        lines.append(("held-out perplexity: float32, weight-only int8, int8 x int8",
                      ", ".join(str(v) for v in result["perplexity"].values())))
    report("int8 products: weight-only, int8 x int8 (w8a8), float32, widened", lines, result,
           args.json)


if __name__ == "__main__":
    main()
