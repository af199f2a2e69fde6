"""cpu/dropout.py: dropout from four random lanes per draw is inverted dropout, equal to the
textbook formula from the same random numbers."""

import pytest
import torch

from vaswani.cpu.dropout import LaneDropout as Dropout
from vaswani.cpu.dropout import lane_dropout as dropout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_drops_about_p_and_preserves_the_mean(dtype):
    torch.manual_seed(0)
    x = torch.ones(1000, 1001, dtype=dtype)  # odd size: the last int64 is shared by < 4 lanes
    y = dropout(x, 0.1)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.002
    kept = y[y != 0].float()
    assert torch.allclose(kept, torch.full_like(kept, 1 / 0.9), rtol=1e-2)
    assert abs(y.float().mean().item() - 1.0) < 0.005


def test_each_element_decides_independently():
    """The four lanes of one random integer must not be correlated: neighbours are dropped
    together only about p^2 of the time."""
    torch.manual_seed(0)
    y = dropout(torch.ones(4_000_000), 0.5)
    dropped = (y == 0).view(-1, 4)
    both = (dropped[:, 0] & dropped[:, 1]).float().mean().item()
    assert abs(both - 0.25) < 0.003
    for lane in range(4):
        assert abs(dropped[:, lane].float().mean().item() - 0.5) < 0.003


def test_follows_the_seed_and_is_identity_in_eval_or_at_zero():
    x = torch.randn(64, 64)
    torch.manual_seed(3)
    a = dropout(x, 0.2)
    torch.manual_seed(3)
    assert torch.equal(a, dropout(x, 0.2))
    assert dropout(x, 0.2, training=False) is x
    assert dropout(x, 0.0) is x
    module = Dropout(0.3).eval()
    assert module(x) is x


def test_gradient_is_the_same_mask_and_scale():
    torch.manual_seed(0)
    x = torch.randn(50, 40, requires_grad=True)
    y = dropout(x, 0.25)
    y.sum().backward()
    expected = (y != 0).float() / (1 - 0.25)
    torch.testing.assert_close(x.grad, expected, rtol=1e-4, atol=1e-6)


def test_rejects_bad_probability():
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.0)
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(torch.ones(3), -0.1)


@pytest.mark.usefixtures("on_cpu")  # the CPU's own path
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_fast_dropout_equals_the_written_out_formula(dtype, p):
    """From the same random numbers, the bit-trick path and the textbook formula (uniform u,
    keep x / (1 - p) where u >= p) drop the same elements and scale the rest alike."""
    from vaswani.cpu.dropout import reference_dropout

    x = torch.randn(37, 101).to(dtype)  # odd size: the last int64 is shared by < 4 lanes
    torch.manual_seed(5)
    fast = dropout(x, p)
    torch.manual_seed(5)
    ref = reference_dropout(x, p)
    assert torch.equal(fast == 0, ref == 0) and 0 < int((fast == 0).sum()) < x.numel()
    torch.testing.assert_close(fast, ref)
    module = Dropout(p)
    torch.manual_seed(5)
    a = module(x)
    torch.manual_seed(5)
    torch.testing.assert_close(a, module.reference(x))


@pytest.mark.usefixtures("on_cpu")  # the CPU's own path
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_survivors_and_their_gradient_are_scaled_by_the_exact_inverse_keep_rate(dtype):
    """Kept elements are ``x * (1 / (1 - p))`` to the bit, as the dtype's own product by the
    scalar rounds it (in bf16 the scale must not be rounded to bf16 first, 1 / 0.9 -> 1.109),
    and so is the gradient; dropped elements and their gradient are zero."""
    p = 0.1
    scale = 65536 / (65536 - round(p * 65536))
    x = torch.randn(64, 257).to(dtype).requires_grad_()
    g = torch.randn(64, 257).to(dtype)
    torch.manual_seed(1)
    y = dropout(x, p)
    y.backward(g)
    kept = y != 0
    assert 0.05 < 1 - kept.double().mean().item() < 0.15
    with torch.no_grad():
        assert torch.equal(y[kept], (x * scale)[kept])
        assert torch.equal(x.grad[kept], (g * scale)[kept])
        assert not x.grad[~kept].any()
