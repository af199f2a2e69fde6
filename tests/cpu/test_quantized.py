"""int8 linear layers (cpu/quantized.py): PyTorch's fbgemm kernel equals the arithmetic written
out, stays close to the float layer, serves multi-head attention's fused projection part by
part, and quantize_linears reaches every linear layer of a model."""

import copy
import os

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from vaswani import ModelConfig, build_model
from vaswani.cpu.dynamic import Int8Linear, reference_int8_linear
from vaswani.cpu.quantized import quantize_linears
from vaswani.nn import Heads, MultiHeadAttention

pytestmark = pytest.mark.usefixtures("on_cpu")  # int8 is a CPU path


@pytest.mark.parametrize("shape", [(5, 64), (3, 7, 64), (1, 64)])
@pytest.mark.parametrize("bias", [True, False])
def test_the_int8_kernel_equals_its_written_out_arithmetic(shape, bias):
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=bias)
    q = Int8Linear.of(linear)
    for x in (torch.randn(shape), 3 * torch.randn(shape), torch.rand(shape)):  # signs, ranges
        got = q(x)
        torch.testing.assert_close(got, reference_int8_linear(x, q.qweight, q.bias),
                                   rtol=1e-5, atol=1e-5)
        # and near the float layer: a weight moves by half its row's step, x by half its own
        err = (got - linear(x)).abs().max()
        assert err < 0.02 * x.abs().max() * linear.weight.abs().sum(1).max()
        assert got.shape == (*shape[:-1], 48)


def test_rows_use_only_their_part_of_the_weight():
    torch.manual_seed(0)
    q = Int8Linear.of(nn.Linear(32, 96))
    x = torch.randn(4, 32)
    whole = q(x)
    torch.testing.assert_close(q.rows(x, 32, 96), whole[:, 32:], rtol=0, atol=1e-6)
    torch.testing.assert_close(q.rows(x, 0, 32), whole[:, :32], rtol=0, atol=1e-6)
    assert set(q._packed) == {(0, 96), (32, 96), (0, 32)}  # each part packed once


def test_cross_attention_through_an_int8_fused_projection():
    """Cross-attention projects its queries and its memory with parts of in_proj: with int8
    they are the parts of the int8 weight (the same as a float layer holding the dequantized
    weight, up to the inputs' rounding)."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(Heads(32, 4)).eval()
    x, memory = torch.randn(2, 3, 32), torch.randn(2, 5, 32)
    want, _ = mha(x, memory=memory)
    mha.in_proj, mha.out_proj = Int8Linear.of(mha.in_proj), Int8Linear.of(mha.out_proj)
    got, _ = mha(x, memory=memory)
    k, v = mha.project_kv(memory)
    assert k.shape == v.shape == (2, 4, 5, 8)
    assert (got - want).abs().max() < 0.05


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder", "encoder"])
def test_quantize_linears_reaches_every_linear_layer(arch):
    torch.manual_seed(0)
    classes = {"n_classes": 3} if arch == "encoder" else {}
    model = build_model(ModelConfig(arch=arch, vocab_size=40, d_model=32, n_heads=4, d_ff=64,
                                    n_layers=2, dropout=0.0, max_len=32, **classes)).eval()
    ids = torch.randint(3, 40, (2, 9))
    with torch.no_grad():
        want = model(ids, ids) if arch == "encoder-decoder" else model(ids)
        quantize_linears(model)
        got = model(ids, ids) if arch == "encoder-decoder" else model(ids)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) > 0
    assert (got - want).abs().max() < 0.1 * want.abs().max()


def test_int8_refuses_a_model_off_the_cpu():
    model = nn.Sequential(nn.Linear(4, 4)).to("meta")
    with pytest.raises(ValueError, match="int8 runs on a CPU; the model is on meta"):
        quantize_linears(model)


# --- weight-only int8 and int4 (language models) ----------------------------------------------

WEIGHT_ONLY = [(8, 32), (4, 32), (4, 64)]  # bits, and the int4 groups' inputs


@pytest.mark.parametrize("bits,group", WEIGHT_ONLY)
@pytest.mark.parametrize("bias", [True, False])
def test_the_weight_only_kernels_equal_their_written_out_arithmetic(bits, group, bias):
    from vaswani.cpu.quantized import WeightOnlyLinear, reference_weight_only

    torch.manual_seed(0)
    linear = nn.Linear(128, 48, bias=bias)
    q = WeightOnlyLinear.of(linear, bits, group)
    for x in (torch.randn(5, 128), 3 * torch.randn(2, 7, 128)):
        got = q(x)
        assert got.shape == (*x.shape[:-1], 48) and got.dtype == torch.float32
        want = reference_weight_only(x, q, linear.weight)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
        # and near the float layer: int8 a row's step, int4 a group's
        err = (got - linear(x)).abs().max()
        assert err < (0.02 if bits == 8 else 0.1) * x.abs().max() * linear.weight.abs().sum(1).max()


@pytest.mark.parametrize("bits,group", WEIGHT_ONLY)
def test_a_rows_result_is_the_same_bit_for_bit_alone_and_in_any_batch(bits, group):
    """Weight-only: the input is never scaled by its neighbours. The dynamic int8 layer (a
    translator's) takes one scale for all the rows of a call, and is not."""
    from vaswani.cpu.quantized import WeightOnlyLinear

    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    q = WeightOnlyLinear.of(linear, bits, group)
    x = torch.randn(17, 64)
    x[5] *= 50  # a row of large values beside small ones
    whole = q(x)
    for i in (0, 3, 16):
        assert torch.equal(q(x[i:i + 1]), whole[i:i + 1])
    dynamic = Int8Linear.of(linear)
    assert not torch.equal(dynamic(x[:1]), dynamic(x)[:1])


def test_an_int8_token_table_looks_up_each_row_within_its_step():
    """Int8Embedding: a row is its int8 levels times its scale, within half a step of the
    float row; the padding row (zeros) stays zeros; ids of any shape."""
    from vaswani.cpu.quantized import Int8Embedding, int8_rows

    torch.manual_seed(0)
    table = nn.Embedding(50, 24, padding_idx=0)
    q = Int8Embedding(table.weight)
    ids = torch.randint(0, 50, (3, 7))
    got = q(ids)
    assert got.shape == (3, 7, 24) and got.dtype == torch.float32
    levels, scales = int8_rows(table.weight)
    assert torch.equal(got, levels[ids].float() * scales[ids][..., None])
    step = scales[ids][..., None]
    assert ((got - table(ids)).abs() <= step / 2 + 1e-6).all()
    assert torch.equal(q(torch.tensor([0])), torch.zeros(1, 24))


def test_int4_keeps_8_bits_where_the_kernel_takes_no_4():
    from vaswani.cpu.quantized import WeightOnlyLinear

    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 10))  # 10 outputs: not in sixteens
    quantize_linears(model, "int4")
    assert [m.bits for m in model if isinstance(m, WeightOnlyLinear)] == [4, 8]


def test_int4_g64_groups_64_inputs_and_keeps_8_bits_where_they_do_not_divide():
    """``int4-g64``: a scale and an offset per 64 inputs (half of ``int4``'s), so a layer of
    96 inputs, whole groups of 32 but not of 64, keeps 8 bits."""
    from vaswani.cpu.quantized import WeightOnlyLinear, reference_weight_only

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 96), nn.Linear(96, 48))
    float_first = nn.Linear(128, 96)
    float_first.load_state_dict(model[0].state_dict())
    quantize_linears(model, "int4-g64")
    assert [(m.bits, m.group) for m in model] == [(4, 64), (8, 32)]
    assert model[0].scales.shape == (2, 96, 2)  # (in / 64, out, scale and offset)
    finer = WeightOnlyLinear.of(float_first, 4, 32)
    x = torch.randn(3, 128)
    assert not torch.equal(model[0](x), finer(x))  # another rounding of the same weight
    plain = nn.Linear(128, 48, bias=False)  # two groups a row: the weight it multiplies by
    layer = WeightOnlyLinear.of(plain, 4, 64)
    assert torch.equal(layer.dequantized().T,
                       reference_weight_only(torch.eye(128), layer, plain.weight))


def test_a_language_model_quantized_generates_alone_what_it_generates_in_a_batch():
    """int8 and int4 language models (weight-only): 16 greedy completions of unlike prompts
    decoded together on the engine are each what that prompt gives alone."""
    from vaswani.engine import Engine, EngineConfig
    from vaswani.engine.request import Params, Request

    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="decoder", vocab_size=40, d_model=32, n_heads=4,
                                    d_ff=64, n_layers=2, dropout=0.0, max_len=64)).eval()
    prompts = [[3 + (7 * i + j) % 37 for j in range(2 + i % 5)] for i in range(16)]
    for kind in ("int8", "int4"):
        m = quantize_linears(copy.deepcopy(model), kind, weight_only=True)
        engine = Engine(m, bos_id=1, eos_id=2, config=EngineConfig(max_rows=16))
        together = [Request(p, Params(max_new_tokens=12)) for p in prompts]
        engine.run(together)
        for p, r in zip(prompts, together, strict=True):
            alone = Request(p, Params(max_new_tokens=12))
            engine.run([alone])
            assert alone.output == r.output, kind


def test_a_large_weight_is_quantized_in_row_blocks_as_it_would_be_whole(on_cpu):
    """int8_rows and int4_packed work ROWS rows at a time (a vocabulary projection's
    temporaries stay small); the result is the one the whole weight gives at once."""
    from vaswani.cpu import quantized as q

    w = torch.randn(q.ROWS * 2 + 48, 64)
    ints, scales = q.int8_rows(w)
    whole = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).to(torch.bfloat16).float()
    assert torch.equal(scales, whole)  # the scales as the kernel reads them (bfloat16)
    assert torch.equal(ints, torch.round(w / whole[:, None]).clamp(-127, 127).to(torch.int8))
    levels, s, o = q.int4_groups(w)
    packed, pairs = q.int4_packed(w)
    assert torch.equal(packed, torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels, 1))
    assert torch.equal(pairs, torch.stack([s, o], -1).transpose(0, 1).contiguous()
                       .to(torch.bfloat16))


ODD = {"d_model": 40, "n_heads": 4, "d_ff": 100}  # inputs of 40 and 100: not in sixteens


def test_layers_whose_inputs_the_int8_kernel_cannot_take_stay_in_float():
    """The weight-only int8 kernel reads a row's inputs in eights (AVX2) or sixteens
    (AVX-512): 36 or 100 inputs gave wrong sums (AVX2), 40 a SIGSEGV (AVX-512, a Xeon of
    family 6 model 207). Those layers stay float, the rest are quantized, and the model's
    output stays near the float one's."""
    from vaswani.cpu.quantized import WeightOnlyLinear

    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="decoder", vocab_size=40, n_layers=1, dropout=0.0,
                                    max_len=32, **ODD)).eval()
    ids = torch.randint(3, 40, (2, 9))
    want = model(ids)
    for kind in ("int8", "int4"):
        m = quantize_linears(copy.deepcopy(model), kind, weight_only=True)
        quantized = [n for n, c in m.named_modules() if isinstance(c, WeightOnlyLinear)]
        assert quantized == []  # 40 and 100 inputs: every layer stays float
        assert_close(m(ids), want)
    model = build_model(ModelConfig(arch="decoder", vocab_size=40, n_layers=1, dropout=0.0,
                                    max_len=32, d_model=48, n_heads=4, d_ff=100)).eval()
    m = quantize_linears(copy.deepcopy(model), "int8", weight_only=True)
    layer = m.decoder.layers[0].feed_forward
    assert isinstance(layer.linear1, WeightOnlyLinear)  # 48 inputs
    assert isinstance(layer.linear2, nn.Linear)  # 100 inputs: float
    assert (m(ids) - model(ids)).abs().max() < 0.1


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_generate_and_serve_quantized_answer_for_odd_widths(kind, tmp_path):
    """`vaswani generate --quantize` on a run of odd widths ends normally (it ended in a
    signal), through the quantized load (weights quantized as they are read), and the server
    answers a completion."""
    import subprocess
    import sys

    from fastapi.testclient import TestClient

    import vaswani
    from tests.training.fixtures import config, text_file
    from vaswani.cli import main
    from vaswani.serve import create_app

    cfg = config(tmp_path / "c.toml", "decoder", text_file(tmp_path / "t.txt", n=200),
                 model={**ODD, "n_layers": 1}, train={"max_steps": 2, "device": "cpu"})
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run), "--no-progress"]) == 0
    done = subprocess.run([sys.executable, "-m", "vaswani", "generate", str(run), "--prompt",
                           "ab", "--max-new-tokens", "5", "--quantize", kind],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with TestClient(create_app({"odd": vaswani.load(run, quantize=kind)}),
                    base_url="http://127.0.0.1") as client:
        r = client.post("/v1/completions", json={"model": "odd", "prompt": "ab",
                                                 "max_tokens": 4})
        assert r.status_code == 200, r.text


# --- QLoRA: a gradient through the frozen quantized weights -----------------------------------

@pytest.mark.parametrize("out_features", [16, 48, 96, 4096 + 48])
def test_int4_levels_unpack_from_the_kernels_own_packing(out_features):
    from vaswani.cpu.quantized import int4_groups, int4_packed, int4_unpacked

    weight = torch.randn(out_features, 64)
    packed, _ = int4_packed(weight)  # torch's _convert_weight_to_int4pack_for_cpu
    assert torch.equal(int4_unpacked(packed, out_features, 64), int4_groups(weight)[0])


def test_int4_levels_unpack_from_the_avx2_kernels_packing_too():
    """PyTorch packs int4 rows in blocks of 64 with its AVX-512 kernels and of 32 with its
    AVX2 ones; a process limited to AVX2 (ATEN_CPU_CAPABILITY) unpacks its own packing."""
    import subprocess
    import sys

    code = ("import torch\n"
            "from vaswani.cpu.quantized import int4_groups, int4_packed, int4_unpacked\n"
            "assert torch.backends.cpu.get_cpu_capability() == 'AVX2'\n"
            "for n in (48, 96, 4096 + 80):\n"
            "    w = torch.randn(n, 64)\n"
            "    assert torch.equal(int4_unpacked(int4_packed(w)[0], n, 64), int4_groups(w)[0])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2"})
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("bits,group", WEIGHT_ONLY)
def test_a_weight_only_layer_passes_its_input_the_gradient_of_its_dequantized_weight(bits,
                                                                                     group):
    from vaswani.cpu.quantized import WeightOnlyLinear, reference_weight_only

    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    layer = WeightOnlyLinear.of(linear, bits, group)
    assert f"int{bits} weights" in repr(layer)
    x = torch.randn(2, 5, 64).bfloat16().float().requires_grad_(True)  # bf16: no rounding
    y = layer(x)
    with torch.no_grad():  # the forward pass is the kernel's, unchanged
        assert torch.equal(y, layer(x))
        assert_close(y, reference_weight_only(x, layer, linear.weight), rtol=1e-2, atol=1e-2)
    weight = layer.dequantized()
    expected = reference_weight_only(torch.eye(64), layer, linear.weight) - linear.bias
    assert_close(weight.T, expected, rtol=0, atol=0)  # the weight the kernel multiplies by
    grad = torch.randn_like(y)
    y.backward(grad)
    assert_close(x.grad, grad @ weight, rtol=0, atol=0)
    assert y.dtype == x.grad.dtype == torch.float32  # the gradient is not rounded to bf16


def test_int4_g64_as_read_equals_int4_g64_after_a_float_load(tmp_path):
    """``vaswani.load(..., quantize="int4-g64")``'s reader (checkpoint/quantized.py) makes
    the layers that quantizing the float model makes: 64-input groups, bit for bit, and a
    mixture of experts' router left in float."""
    from vaswani.checkpoint import save_weights
    from vaswani.checkpoint.quantized import load_quantized
    from vaswani.cpu.quantized import WeightOnlyLinear

    config = ModelConfig(arch="decoder", vocab_size=64, d_model=128, n_heads=4, d_ff=256,
                         n_layers=1, norm_first=True, activation="swiglu", bias=False,
                         positional="rope", experts={"count": 2, "per_token": 1})
    torch.manual_seed(0)
    model = build_model(config, fast=False).eval()
    save_weights(model, tmp_path / "model.safetensors")
    streamed = build_model(config, device="meta", initialise=False, fast=False)
    load_quantized(streamed, tmp_path / "model.safetensors", "int4-g64", weight_only=True)
    whole = quantize_linears(copy.deepcopy(model), "int4-g64", weight_only=True)
    layers = {n: m for n, m in streamed.named_modules() if isinstance(m, WeightOnlyLinear)}
    assert {(m.bits, m.group) for m in layers.values()} >= {(4, 64)}
    for name, layer in layers.items():
        other = whole.get_submodule(name)
        assert (layer.bits, layer.group) == (other.bits, other.group), name
        assert torch.equal(layer.qweight, other.qweight), name
        assert torch.equal(layer.scales, other.scales), name
    router = streamed.decoder.layers[0].feed_forward.router
    assert torch.equal(router.weight, model.decoder.layers[0].feed_forward.router.weight)
