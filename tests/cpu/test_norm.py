"""cpu/norm.py: RMSNorm as one autograd node gives nn/'s output to the bit and autograd's
gradients (for a weight that trains and for a frozen one), and leaves inference to nn/."""

import pytest
import torch
from torch.testing import assert_close

from vaswani.cpu.norm import CPURMSNorm, rms_norm
from vaswani.nn.norm import RMSNorm


def _pair(d=24, trains=True):
    torch.manual_seed(0)
    plain = RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        plain.weight.uniform_(0.5, 1.5)
    plain.weight.requires_grad_(trains)
    return plain, CPURMSNorm.of(plain)


@pytest.mark.parametrize("trains", [True, False], ids=["weight-trains", "frozen-weight"])
def test_one_node_equals_autograd_through_nn(trains):
    plain, fast = _pair(trains=trains)
    assert fast.weight is plain.weight
    x = torch.randn(3, 7, 24) * 3
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = plain(xa), fast(xb)
    assert torch.equal(a, b)  # nn/'s operators in nn/'s order
    assert type(b.grad_fn).__name__ == "_RMSNormBackward"
    grad = torch.randn_like(a)
    wanted = [xa] + ([plain.weight] if trains else [])
    expected = torch.autograd.grad(a, wanted, grad)
    got = torch.autograd.grad(b, [xb] + ([fast.weight] if trains else []), grad)
    for e, g in zip(expected, got, strict=True):
        assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_gradients_equal_a_float64_reference():
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    w = torch.rand(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, w, 1e-5), (x, w))


def test_a_frozen_weight_gets_no_gradient_and_an_input_without_one_none():
    plain, fast = _pair(trains=False)
    x = torch.randn(4, 24, requires_grad=True)
    fast(x).sum().backward()
    assert x.grad is not None and fast.weight.grad is None
    plain.weight.requires_grad_(True)
    fast(torch.randn(4, 24)).sum().backward()  # only the weight needs one
    assert fast.weight.grad is not None and fast.weight.grad.shape == (24,)


def test_inference_runs_nn_as_written():
    plain, fast = _pair()
    x = torch.randn(2, 3, 24)
    with torch.no_grad():
        y = fast(x)
    assert y.grad_fn is None and torch.equal(y, plain(x).detach())
    fast.weight.requires_grad_(False)
    y = fast(x)  # autograd on, nothing needs a gradient: no node is recorded either way
    assert y.grad_fn is None and torch.equal(y, plain(x))
