"""cpu/linear.py: a Linear's CPU inference path (oneDNN over a reordered copy of the weight,
rows padded to a bucket) gives F.linear's outputs, whole or by parts, and is used only where
it may be: no gradients, float32, a CPU that is not Intel's. The tests below force it on
(``OneDNNLinear.onednn``), so that it is tested on every machine."""

import pytest
import torch
import torch.nn.functional as F

import vaswani.cpu.linear
from vaswani.cpu.linear import MIN_MACS, MIN_WEIGHT, bucket, onednn_available
from vaswani.cpu.linear import OneDNNLinear as Linear

pytestmark = [pytest.mark.skipif(not onednn_available(), reason="no oneDNN in this PyTorch"),
              pytest.mark.usefixtures("on_cpu")]


@pytest.fixture(autouse=True)
def onednn(monkeypatch):
    monkeypatch.setattr(vaswani.cpu.linear.OneDNNLinear, "onednn", True)


def test_an_intel_cpu_keeps_f_linear(monkeypatch):
    """Where the CPU is Intel's, MKL (F.linear) runs AVX-512 itself: no reordered copy."""
    monkeypatch.setattr(vaswani.cpu.linear.OneDNNLinear, "onednn", False)
    linear = Linear(16, 8).eval()
    x = torch.randn(20000, 16)
    with torch.no_grad():
        torch.testing.assert_close(linear(x), F.linear(x, linear.weight, linear.bias))
    assert linear._packed == {}


@pytest.mark.parametrize("shape", [(1, 48), (3, 48), (600, 48), (2, 400, 48)])
def test_the_cpu_path_equals_f_linear_whole_and_by_parts(shape):
    torch.manual_seed(0)
    linear = Linear(48, 96).eval()
    x = torch.randn(shape)
    with torch.inference_mode():
        whole = linear(x)
        part = linear.rows(x, 32, 96)
    torch.testing.assert_close(whole, F.linear(x, linear.weight, linear.bias))
    torch.testing.assert_close(part, F.linear(x, linear.weight[32:], linear.bias[32:]))
    assert whole.shape == (*shape[:-1], 96) and part.shape == (*shape[:-1], 64)
    small = x.numel() // 48 * linear.weight.numel() < MIN_MACS  # keeps F.linear
    assert set(linear._packed) == (set() if small else {(0, 96), (32, 96)})


def test_a_large_weight_takes_the_copy_at_one_row_a_small_one_not():
    """A vocabulary projection's weight (MIN_WEIGHT numbers or more) multiplies one row
    through oneDNN (its call's fixed cost is small beside reading such a weight); a small
    weight keeps F.linear for a few rows."""
    torch.manual_seed(0)
    large, small = Linear(64, MIN_WEIGHT // 64).eval(), Linear(64, 256).eval()
    x = torch.randn(1, 64)
    with torch.inference_mode():
        for layer in (large, small):
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    assert set(large._packed) == {(0, MIN_WEIGHT // 64)} and small._packed == {}


def test_padding_a_product_to_its_bucket_changes_no_row():
    torch.manual_seed(0)
    linear = Linear(32, 1000).eval()
    x = torch.randn(145, 32)  # padded to 160 rows; its first 70 alone, to 96
    with torch.no_grad():
        assert torch.equal(linear(x)[:70], linear(x[:70]))
    assert linear._packed
    assert [bucket(m) for m in (1, 3, 17, 33, 65, 512, 513)] == [1, 4, 32, 64, 96, 512, 768]


def test_rows_at_their_bucket_and_strided_inputs_are_not_padded_yet_equal_f_linear():
    """64 rows are a bucket's own size: no padded copy is made, and a strided input (a
    column slice, a transposed view) still multiplies as F.linear does."""
    torch.manual_seed(0)
    linear = Linear(48, 1024).eval()  # 64 x 48 x 1024 multiply-adds: past MIN_MACS
    for x in (torch.randn(64, 48), torch.randn(64, 96)[:, ::2], torch.randn(48, 64).t(),
              torch.randn(2, 32, 48).transpose(0, 1)):
        with torch.no_grad():
            torch.testing.assert_close(linear(x), F.linear(x, linear.weight, linear.bias))
    assert linear._packed


def test_training_and_other_dtypes_use_f_linear_and_get_gradients():
    torch.manual_seed(0)
    linear = Linear(16, 8).eval()
    x = torch.randn(10, 16, requires_grad=True)
    linear(x).sum().backward()  # gradients on: F.linear
    assert linear.weight.grad is not None and x.grad is not None
    assert linear._packed == {}
    with torch.no_grad():
        linear.train()(x)  # training mode: F.linear (a fused optimizer may change it unseen)
    assert linear._packed == {}
    double = Linear(16, 8).double().eval()
    with torch.no_grad():
        torch.testing.assert_close(double(x.double()), F.linear(x.double(), double.weight,
                                                                double.bias))
    assert double._packed == {}


def test_a_changed_weight_is_reordered_again():
    torch.manual_seed(0)
    linear = Linear(16, 8).eval()
    x = torch.randn(20000, 16)
    with torch.no_grad():
        before = linear(x)
        linear.weight.mul_(2)  # in place: its version moves
        torch.testing.assert_close(linear(x) - linear.bias, 2 * (before - linear.bias))


def test_a_fused_optimizer_step_between_evaluations_is_seen():
    """AdamW(fused=True), what training uses, writes the weight without moving its version
    counter: going back to training mode drops the copy, so the next evaluation sees the
    new weight."""
    torch.manual_seed(0)
    linear = Linear(16, 8)
    optimizer = torch.optim.AdamW(linear.parameters(), lr=0.5, fused=True)
    x = torch.randn(20000, 16)
    for _ in range(3):
        linear.train()
        linear(x).square().sum().backward()
        version = linear.weight._version
        optimizer.step()
        optimizer.zero_grad()
        assert linear.weight._version == version  # the version alone would not tell
        with torch.no_grad():
            torch.testing.assert_close(linear.eval()(x), F.linear(x, linear.weight,
                                                                  linear.bias))
        assert linear._packed  # evaluated through the copy


def test_torch_compile_takes_f_linear_without_breaking_its_graph():
    """Under torch.compile (an evaluation of a compiled model) the layer asks nothing that
    breaks the graph (``is_inference``) before it knows it is being compiled."""
    torch.manual_seed(0)
    linear = Linear(48, 1024).eval()
    x = torch.randn(64, 48)
    compiled = torch.compile(linear, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), F.linear(x, linear.weight, linear.bias))
    assert linear._packed == {}


class OneDNNCalls(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts oneDNN's linear calls and ATen's products inside it."""

    def __init__(self):
        super().__init__()
        self.onednn = self.aten = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.onednn += name == "mkldnn._linear_pointwise"
        self.aten += name in ("aten.mm", "aten.addmm", "aten.bmm")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("part", [None, (32, 96)])
def test_a_frozen_weight_multiplies_through_onednn_while_training(part):
    """A LoRA layer's frozen base: forward and the input's gradient through oneDNN (no ATen
    product, no reordered copy), equal to F.linear's; the weight gets no gradient."""
    torch.manual_seed(0)
    linear = Linear(48, 96).train().requires_grad_(False)
    x = torch.randn(4, 200, 48, requires_grad=True)  # past MIN_MACS
    g = torch.randn(4, 200, 96 if part is None else part[1] - part[0])
    with OneDNNCalls() as calls:
        y = linear(x) if part is None else linear.rows(x, *part)
        y.backward(g)
    assert (calls.onednn, calls.aten) == (2, 0)  # forward, then the input's gradient
    x_ref = x.detach().requires_grad_()
    w, b = (linear.weight, linear.bias) if part is None else \
        (linear.weight[part[0]:part[1]], linear.bias[part[0]:part[1]])
    y_ref = F.linear(x_ref, w, b)
    y_ref.backward(g)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    assert linear.weight.grad is None and linear._packed == {}


def test_a_compiled_training_step_keeps_the_frozen_products_on_onednn():
    """Under torch.compile (``[train] compile = true``) a frozen weight's product, forward and
    the input's gradient, is oneDNN's opaque call (``vaswani::onednn_linear``: Inductor's
    own lowering of oneDNN's product takes only a constant weight and fails on this one), no
    ATen product, with F.linear's values; an export (no gradients) still traces F.linear, which
    exporters know."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    linear = Linear(48, 96).train().requires_grad_(False)
    x = torch.randn(4, 200, 48, requires_grad=True)
    g = torch.randn(4, 200, 96)
    compiled = torch.compile(linear, fullgraph=True)

    def step():
        y = compiled(x)
        y.backward(g)
        return y

    y, (forward, backward) = run_and_get_code(step)
    for code in (forward, backward):
        assert "vaswani.onednn_linear" in code
        assert "extern_kernels.mm" not in code and "addmm" not in code
    x_ref = x.detach().requires_grad_()
    y_ref = F.linear(x_ref, linear.weight, linear.bias)
    y_ref.backward(g)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    exported = torch.export.export(linear.eval(), (x,))
    assert [str(n.target) for n in exported.graph.nodes if n.op == "call_function"] == \
        ["aten.linear.default"]


def test_a_frozen_weight_under_an_input_without_gradient_computes_none():
    torch.manual_seed(0)
    linear = Linear(48, 96).requires_grad_(False)
    x = torch.randn(800, 48)
    adapter = torch.randn(96, requires_grad=True)  # something after it trains
    with OneDNNCalls() as calls:
        (linear(x) * adapter).sum().backward()
    assert calls.onednn == 1 and adapter.grad is not None


def test_a_weight_that_trains_small_products_and_autocast_keep_f_linear():
    """Only a frozen float32 weight at MIN_MACS or more takes oneDNN under autograd: a
    weight that trains gets MKL's gradient as before, and autocast multiplies in bfloat16."""
    torch.manual_seed(0)
    trained, frozen = Linear(48, 96, bias=False), Linear(48, 96).requires_grad_(False)
    x, few = torch.randn(800, 48, requires_grad=True), torch.randn(2, 48, requires_grad=True)
    for layer, inputs in ((trained, x), (frozen, few)):
        with OneDNNCalls() as calls:
            layer(inputs).sum().backward()
        assert calls.onednn == 0 and calls.aten >= 2
    assert trained.weight.grad is not None
    with OneDNNCalls() as calls, torch.autocast("cpu", dtype=torch.bfloat16):
        out = frozen(x)
    assert calls.onednn == 0 and out.dtype == torch.bfloat16


def test_an_intel_cpu_keeps_f_linear_for_frozen_weights_too(monkeypatch):
    monkeypatch.setattr(vaswani.cpu.linear.OneDNNLinear, "onednn", False)
    linear = Linear(48, 96).requires_grad_(False)
    with OneDNNCalls() as calls:
        linear(torch.randn(800, 48, requires_grad=True)).sum().backward()
    assert calls.onednn == 0


def test_times_transposed_multiplies_by_a_matrix_and_by_its_transpose():
    torch.manual_seed(0)
    h, w, p = torch.randn(30, 16), torch.randn(40, 16), torch.randn(30, 40)
    with OneDNNCalls() as calls:
        torch.testing.assert_close(vaswani.cpu.linear.times_transposed(h, w), h @ w.T)
        torch.testing.assert_close(vaswani.cpu.linear.times_transposed(p, w.T), p @ w)
    assert (calls.onednn, calls.aten) == (2, 2)  # the references' two
