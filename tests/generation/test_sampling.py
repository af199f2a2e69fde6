"""Choosing tokens from scores (generation/sampling.py)."""

import torch

from vaswani.generation.sampling import BLOCK_ROWS, block_width, first_max, sample_rows


def test_first_max_is_argmax_with_ties_nan_and_minus_infinity():
    """The fast greedy choice picks what ``argmax`` picks: the first of tied maxima, a NaN
    where there is one, and index 0 of a row of -inf."""
    g = torch.Generator(torch.get_default_device()).manual_seed(0)
    x = torch.randint(0, 4, (64, 300), generator=g).float()
    x[5, 17] = float("nan")
    x[9] = float("-inf")
    assert torch.equal(first_max(x), x.argmax(-1))
    assert first_max(torch.tensor([[1.0, 3.0, 3.0, 2.0]])).tolist() == [1]


def test_block_widths_divide_the_vocabulary_in_vector_multiples():
    assert block_width(6000) == 400 and block_width(8000) == 400 and block_width(640) == 160
    assert block_width(32768) == 512
    assert block_width(50257) is None and block_width(300) is None and block_width(96) is None


def test_first_max_by_blocks_is_argmax_with_ties_across_and_within_blocks(on_cpu):
    """On a CPU, many rows of a vocabulary that splits into blocks: the blocks' maxima
    first. The first of tied maxima wins where they lie in different blocks (in either
    order) and in one block, NaN beats everything (the first NaN), -inf rows give 0."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * BLOCK_ROWS, 640, generator=g)  # blocks of 160
    x[0, [500, 20]] = 9.0  # tied across blocks 3 and 0
    x[1, [170, 300, 171]] = 9.0  # tied in block 1, and in block 1 again
    x[2, 639] = 9.0  # the last entry
    x[3, [400, 200]] = float("nan")  # NaNs in blocks 2 and 1: the first NaN
    x[4, 100], x[4, 5] = 9.0, float("nan")
    x[5] = float("-inf")
    x[6] = 1.0  # all tied
    assert torch.equal(first_max(x), x.argmax(-1))
    assert first_max(x)[:7].tolist() == [20, 170, 639, 200, 5, 0, 0]
    strided = torch.randn(640, 2 * BLOCK_ROWS, generator=g).t()  # not contiguous
    assert torch.equal(first_max(strided), strided.argmax(-1))


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
