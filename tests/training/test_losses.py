import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from vaswani.training.losses import smoothed_cross_entropy

PAD = 0


def independent_smoothed_loss(logits, target, eps, pad_id):
    """Build the target distribution explicitly and take the cross-entropy against it."""
    V = logits.size(-1)
    dist = torch.full_like(logits, eps / (V - 2))
    dist[:, pad_id] = 0.0
    dist.scatter_(1, target[:, None], 1.0 - eps)
    keep = target != pad_id
    per_token = -(dist * logits.log_softmax(-1)).sum(-1)
    return per_token[keep].sum(), keep.sum()


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_label_smoothing_against_an_explicit_distribution_with_padding(eps):
    logits = torch.randn(12, 9, dtype=torch.float64)
    target = torch.randint(1, 9, (12,))
    target[[2, 5, 11]] = PAD
    loss, nll, count = smoothed_cross_entropy(logits, target, smoothing=eps, pad_id=PAD)
    expected, expected_count = independent_smoothed_loss(logits, target, eps, PAD)
    assert_close(loss, expected)
    assert count == expected_count == 9
    # The NLL beside it is unsmoothed and also ignores padding.
    assert_close(nll, F.cross_entropy(logits, target, ignore_index=PAD, reduction="sum"))


def test_no_smoothing_is_plain_cross_entropy():
    logits = torch.randn(10, 7)
    target = torch.randint(0, 7, (10,))
    loss, nll, count = smoothed_cross_entropy(logits, target, pad_id=None)
    assert_close(loss, F.cross_entropy(logits, target, reduction="sum"))
    assert_close(loss, nll)
    assert count == 10


def test_smoothing_puts_no_mass_on_padding():
    """Raising the pad logit must not change the smoothed loss of a real target beyond the
    softmax normalisation: torch's built-in label_smoothing, which spreads eps over pad too,
    gives a different number."""
    logits = torch.randn(4, 6, dtype=torch.float64)
    target = torch.tensor([1, 2, 3, 4])
    ours, _, _ = smoothed_cross_entropy(logits, target, smoothing=0.1, pad_id=PAD)
    torch_builtin = F.cross_entropy(logits, target, label_smoothing=0.1, reduction="sum")
    assert not torch.allclose(ours, torch_builtin)


def test_classification_smoothing_without_pad_spreads_over_all_other_classes():
    logits = torch.randn(5, 4, dtype=torch.float64)
    target = torch.tensor([0, 1, 2, 3, 0])
    eps = 0.2
    loss, _, count = smoothed_cross_entropy(logits, target, smoothing=eps)
    dist = torch.full_like(logits, eps / 3).scatter_(1, target[:, None], 1 - eps)
    expected = -(dist * logits.log_softmax(-1)).sum()
    assert_close(loss, expected)
    assert count == 5
