"""nn/dropout.py: inverted dropout as written in the paper's section 5.4."""

import pytest
import torch

from vaswani.nn.dropout import Dropout, dropout


def test_drops_about_p_and_scales_the_survivors():
    torch.manual_seed(0)
    y = dropout(torch.ones(1000, 1000), 0.1)
    assert abs((y == 0).float().mean().item() - 0.1) < 0.002
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.9))


def test_is_identity_in_evaluation_or_at_zero():
    x = torch.randn(8, 8)
    assert dropout(x, 0.2, training=False) is x and dropout(x, 0.0) is x
    assert Dropout(0.3).eval()(x) is x


def test_rejects_a_bad_probability():
    with pytest.raises(ValueError, match=r"dropout probability \(1.0\) must be in \[0, 1\)"):
        Dropout(1.0)
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(torch.ones(3), -0.1)
