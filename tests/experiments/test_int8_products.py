"""experiments/int8_products.py: the four int8 ways timed on one weight, the int8 x int8
product written out checked against its arithmetic, and each way's row-by-row bits reported
(timing is never asserted)."""

import torch

from experiments import int8_products
from vaswani.cpu.quantized import WeightOnlyLinear


def test_the_int8_x_int8_product_is_each_rows_rounded_input_times_the_weight():
    """w8a8: each row rounded to int8 on its own scale, summed exactly: equal to the float
    product of the rounded input by the dequantized weight (within float32's rounding), and
    a row's bits the same alone and among other rows (a row of 100x larger values beside it
    changes nothing: the scale is the row's own)."""
    torch.manual_seed(0)
    layer = WeightOnlyLinear(torch.randn(48, 64), None, bits=8)
    x = torch.randn(5, 64)
    x[2] *= 100
    got = int8_products.w8a8(x, layer.qweight, layer.scales)
    scale = x.abs().amax(-1, keepdim=True) / 127
    rounded = (x / scale).round() * scale
    want = rounded.double() @ layer.dequantized().double().t()
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-4 * want.abs().max().item())
    assert int8_products.row_alone_as_in_batch(
        lambda t: int8_products.w8a8(t, layer.qweight, layer.scales), x)


def test_a_shape_at_each_row_count_is_timed_four_ways_with_their_rounding():
    out = int8_products.int8_products(shapes=[(32, 64)], rows=(1, 9), repeats=1)
    assert [(r["shape"], r["rows"]) for r in out["results"]] == [([32, 64], 1), ([32, 64], 9)]
    for r in out["results"]:
        for way in ("weight_only", "w8a8", "float", "widened"):
            assert r[f"{way}_us"] > 0 and isinstance(r[f"{way}_row_alone_as_in_batch"], bool)
        assert r["w8a8_row_alone_as_in_batch"] and r["weight_only_row_alone_as_in_batch"]
        for way in ("weight_only", "w8a8", "widened"):
            assert 0 < r[f"{way}_error"] < 0.05
        assert r["w8a8_speedup"] > 0 and r["widened_speedup"] > 0


def test_a_language_models_perplexity_is_scored_with_each_ways_products(small_runs):
    """--perplexity: the same text scored in float32, weight-only int8 and int8 x int8; the
    last through w8a8 itself (its calls seen), and the layers' own product restored after."""
    lm, _ = small_runs["decoder"]
    calls = []
    w8a8 = int8_products.w8a8
    product = WeightOnlyLinear.product
    try:
        int8_products.w8a8 = lambda *a: calls.append(a[0].shape) or w8a8(*a)
        got = int8_products.perplexities(str(lm), "the cat sat on the mat. " * 8)
    finally:
        int8_products.w8a8 = w8a8
    assert set(got) == {"float32", "weight_only", "w8a8"} and all(v > 1 for v in got.values())
    assert calls and WeightOnlyLinear.product is product
