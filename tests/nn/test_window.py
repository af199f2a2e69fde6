import torch

from vaswani.nn import masks
from vaswani.nn.window import window_mask


def test_a_window_keeps_the_last_tokens_of_each_query():
    """Window 2: position p sees keys p - 1 and p (and, before the causal mask, later ones)."""
    window = window_mask(torch.arange(4), 4, 2) & masks.causal_mask(4)
    expected = torch.tensor([[1, 0, 0, 0],
                             [1, 1, 0, 0],
                             [0, 1, 1, 0],
                             [0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(window, expected)
    # per-row positions (an engine's rows at different lengths): (B, 1, Tq, Tk)
    rows = window_mask(torch.tensor([[3], [1]]), 4, 2)
    assert torch.equal(rows, torch.tensor([[[[0, 0, 1, 1]]], [[[1, 1, 1, 1]]]], dtype=torch.bool))
