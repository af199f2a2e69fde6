import torch
from torch import nn
from torch.testing import assert_close

from vaswani.nn import LayerNorm, RMSNorm


def test_layernorm_matches_torch():
    x = torch.randn(4, 5, 16, dtype=torch.float64) * 3 + 1
    ref = nn.LayerNorm(16, eps=1e-6, dtype=torch.float64)
    ours = LayerNorm(16, eps=1e-6).double()
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
        ours.weight.copy_(ref.weight)
        ours.bias.copy_(ref.bias)
    assert_close(ours(x), ref(x))
    assert_close(ours.reference(x), ref(x))  # the written-out formula


def test_layernorm_without_bias_matches_torch():
    x = torch.randn(3, 8, dtype=torch.float64)
    ref = nn.LayerNorm(8, bias=False, dtype=torch.float64)
    ours = LayerNorm(8, bias=False).double()
    assert_close(ours(x), ref(x))
    assert_close(ours.reference(x), ref(x))


def test_tutorial_std_layernorm_is_a_different_function():
    """The widely copied (x - mean) / (x.std() + eps) uses the unbiased std: not LayerNorm."""
    x = torch.randn(2, 8, dtype=torch.float64)
    tutorial = (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-5)
    assert not torch.allclose(LayerNorm(8).double().reference(x), tutorial, atol=1e-3)


def test_rmsnorm_matches_torch():
    x = torch.randn(4, 16, dtype=torch.float64)
    ref = nn.RMSNorm(16, eps=1e-5, dtype=torch.float64)
    ours = RMSNorm(16, eps=1e-5).double()
    with torch.no_grad():
        ref.weight.normal_()
        ours.weight.copy_(ref.weight)
    assert_close(ours(x), ref(x))
