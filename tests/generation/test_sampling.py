"""Choosing tokens from scores (generation/sampling.py)."""

import torch

from vaswani.generation.sampling import first_max, sample_rows


def test_first_max_is_argmax_with_ties_nan_and_minus_infinity():
    """The fast greedy choice picks what ``argmax`` picks: the first of tied maxima, a NaN
    where there is one, and index 0 of a row of -inf."""
    g = torch.Generator(torch.get_default_device()).manual_seed(0)
    x = torch.randint(0, 4, (64, 300), generator=g).float()
    x[5, 17] = float("nan")
    x[9] = float("-inf")
    assert torch.equal(first_max(x), x.argmax(-1))
    assert first_max(torch.tensor([[1.0, 3.0, 3.0, 2.0]])).tolist() == [1]


def test_greedy_rows_take_the_first_maximum_and_sampled_rows_their_own_draw():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    zero, off = torch.zeros(2), torch.zeros(2, dtype=torch.long)
    tokens = sample_rows(logits, zero, off, torch.ones(2), [None, None])
    assert tokens.tolist() == [1, 0]
    hot = torch.tensor([0.0, 1.0])  # row 1 sampled: its generator decides, every time alike
    a = sample_rows(logits, hot, off, torch.ones(2),
                    [None, torch.Generator().manual_seed(3)])
    b = sample_rows(logits, hot, off, torch.ones(2),
                    [None, torch.Generator().manual_seed(3)])
    assert a[0] == 1 and torch.equal(a, b)
