"""A prefill's int8 products in bfloat16, when asked for (cpu/quantized.py ``widened``,
``EngineConfig.bf16_prefill``, ``--fast-prefill``): the kernel's arithmetic up to one rounding,
every row's bits its own; decoding steps keep the kernel, and so does a vocabulary head. The
tests force the widened path on (``bf16_products``) so that a CPU without bfloat16 products
checks its arithmetic too."""

import copy

import pytest
import torch
from torch import nn

from vaswani import ModelConfig, build_model
from vaswani.checkpoint import save_weights
from vaswani.checkpoint.quantized import load_quantized
from vaswani.cpu import attention, quantized
from vaswani.cpu.quantized import WeightOnlyLinear, quantize_linears, widened, widened_product

pytestmark = pytest.mark.usefixtures("on_cpu")  # int8 is a CPU path


@pytest.fixture
def bf16_on(monkeypatch):
    """The widened product on, whatever this CPU has."""
    monkeypatch.setattr(quantized, "bf16_products", lambda: True)


def kernel(layer: WeightOnlyLinear, x: torch.Tensor) -> torch.Tensor:
    """The weight-only int8 kernel's result for ``layer`` (with its bias), in float32."""
    y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), layer.qweight, layer.scales)
    return y.float() + layer.bias


def rows(seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    x = torch.randn(37, 64)
    x[5] *= 50  # a row of large values beside small ones
    return x


@pytest.mark.usefixtures("bf16_on")
def test_a_prefill_multiplies_int8_in_bfloat16_and_each_rows_bits_are_its_own():
    torch.manual_seed(0)
    layer = WeightOnlyLinear.of(nn.Linear(64, 48), 8)
    x = rows()
    with widened():
        whole = layer(x)
        for a, b in ((0, 1), (3, 4), (5, 6), (0, 17), (20, 37), (36, 37)):
            assert torch.equal(layer(x[a:b]), whole[a:b]), (a, b)
    written = x.to(torch.bfloat16).float() @ layer.dequantized().T  # the sums, written out
    assert torch.equal(whole, widened_product(x.to(torch.bfloat16), layer.qweight,
                                              layer.scales) + layer.bias)
    want = kernel(layer, x)
    for got in (whole, want):  # each within bfloat16's rounding of the sums written out
        assert ((got - layer.bias - written).abs() <= 2 ** -7 * written.abs() + 1e-5).all()
    assert not torch.equal(whole, want)  # another path: not the kernel's bits


@pytest.mark.usefixtures("bf16_on")
def test_int8_keeps_the_kernel_unless_widened_and_int4_always():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    layer, x = WeightOnlyLinear.of(linear, 8), rows()
    with widened(False):
        assert torch.equal(layer(x), kernel(layer, x))
    assert torch.equal(layer(x), kernel(layer, x))
    four = WeightOnlyLinear.of(linear, 4)
    with widened():
        prefilled = four(x)
    assert torch.equal(prefilled, four(x))


def test_without_bfloat16_products_a_prefill_keeps_the_kernel(monkeypatch):
    monkeypatch.setattr(quantized, "bf16_products", lambda: False)
    torch.manual_seed(0)
    layer, x = WeightOnlyLinear.of(nn.Linear(64, 48), 8), rows()
    with widened():
        assert torch.equal(layer(x), kernel(layer, x))


@pytest.mark.parametrize("tied", [True, False])
def test_the_vocabulary_head_keeps_the_kernel_whichever_way_the_model_is_read(tied, tmp_path):
    """quantize_linears and the streamed reader (checkpoint/quantized.py) both mark the head
    narrow, tied to the token table or not, and no other layer."""
    config = ModelConfig(arch="decoder", vocab_size=64, d_model=64, n_heads=4, d_ff=128,
                         n_layers=1, norm_first=True, tie_embeddings=tied)
    torch.manual_seed(0)
    model = build_model(config, fast=False).eval()
    save_weights(model, tmp_path / "model.safetensors")
    streamed = build_model(config, device="meta", initialise=False, fast=False)
    load_quantized(streamed, tmp_path / "model.safetensors", "int8", weight_only=True)
    for m in (quantize_linears(copy.deepcopy(model), "int8", weight_only=True), streamed):
        wide = {n: layer.wide for n, layer in m.named_modules()
                if isinstance(layer, WeightOnlyLinear)}
        assert wide.pop("output_proj") is False
        assert wide and all(wide.values())


def tiny_lm():
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="decoder", vocab_size=40, d_model=32, n_heads=4,
                                    d_ff=64, n_layers=2, dropout=0.0, max_len=64)).eval()
    return quantize_linears(model, "int8", weight_only=True)


@pytest.mark.usefixtures("bf16_on")
def test_an_engine_widens_its_prefills_only_when_asked(monkeypatch):
    """With ``bf16_prefill`` the engine's prefill passes take the widened product and its
    decoding steps and speculation's checks never do; without it, nothing does. Each
    request's log-probabilities stay within bfloat16's rounding of the kernel's."""
    from vaswani.engine import Engine, EngineConfig
    from vaswani.engine.request import Params, Request

    calls = {True: 0, False: 0}  # widened products in prefill passes, and in others
    real = quantized.widened_product

    def counted(*args):
        calls[attention.PASS.get() == "prefill"] += 1
        return real(*args)

    monkeypatch.setattr(quantized, "widened_product", counted)
    model = tiny_lm()
    prompts = [[3 + (7 * i + j) % 37 for j in range(2 + 3 * i % 11)] for i in range(12)]
    prompts += [[5, 6, 7, 8] * 6]  # a repeating prompt: guesses from the context, checked
    got = {}
    for on in (False, True):
        calls.update({True: 0, False: 0})
        engine = Engine(model, bos_id=1, eos_id=2,
                        config=EngineConfig(max_rows=12, bf16_prefill=on))
        requests = [Request(p, Params(max_new_tokens=6, logprobs=1, speculate=3))
                    for p in prompts]
        engine.run(requests)
        got[on] = [[lp for lp, _ in r.logprobs] for r in requests]
        assert requests[-1].speculation.guessed > 0
        assert (calls[True] > 0) is on and calls[False] == 0, (on, calls)
    first = torch.tensor([g[0] for g in got[True]]), torch.tensor([g[0] for g in got[False]])
    torch.testing.assert_close(*first, rtol=0, atol=0.05)
    assert not torch.equal(*first)  # another rounding, not the kernel's bits
