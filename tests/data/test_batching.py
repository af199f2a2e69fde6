import random

import pytest
import torch

from tests.tasks.reference_data import split
from vaswani.data.batching import (
    BatchPlan,
    lm_eval_windows,
    lm_windows,
    pad,
    shard,
    token_budget_batches,
)


def test_token_budget_batches_cover_every_example_once_within_budget():
    rng = random.Random(0)
    lengths = [rng.randint(1, 50) for _ in range(500)]
    batches = token_budget_batches(lengths, max_tokens=400)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 400
    # Length bucketing keeps padding low.
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    assert padded < 1.1 * sum(lengths)


def test_an_example_over_budget_gets_its_own_batch_and_min_size_holds():
    assert [b.tolist() for b in token_budget_batches([5, 100, 5], max_tokens=20)] == [[0, 2], [1]]
    batches = token_budget_batches([10] * 5, max_tokens=10, min_size=2)
    assert all(len(b) >= 2 for b in batches)


def reference_token_budget_batches(lengths, max_tokens, min_size=1):
    """The planner as first written (one Python step per example), kept as the reference."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches, current, longest = [], [], 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if current and len(current) >= min_size and \
                (len(current) + 1) * longest_if_added > max_tokens:
            batches.append(current)
            current, longest_if_added = [], lengths[i]
        current.append(i)
        longest = longest_if_added
    if current:
        if batches and len(current) < min_size:
            batches[-1].extend(current)
        else:
            batches.append(current)
    return batches


@pytest.mark.parametrize("min_size", [1, 2, 3])
def test_the_bisecting_planner_equals_the_example_by_example_one(min_size):
    rng = random.Random(min_size)
    for n, budget in [(1, 5), (7, 30), (500, 400), (3000, 1000)]:
        lengths = [rng.randint(1, 60) for _ in range(n)]
        ours = [b.tolist() for b in token_budget_batches(lengths, budget, min_size)]
        assert ours == reference_token_budget_batches(lengths, budget, min_size), (n, budget)


def test_batch_plan_is_a_pure_function_of_the_index():
    batches = [[i] for i in range(7)]
    a, b = BatchPlan(batches, seed=3), BatchPlan(batches, seed=3)
    seq = [a.indices(i)[0] for i in range(21)]
    assert seq == [b.indices(i)[0] for i in reversed(range(21))][::-1]
    for epoch in range(3):  # each epoch visits every batch once, in a new order
        assert sorted(seq[epoch * 7:(epoch + 1) * 7]) == list(range(7))
    assert seq[:7] != seq[7:14]


def test_shard_splits_a_global_batch_between_ranks():
    items = list(range(7))
    assert shard(items, 0, 2) + shard(items, 1, 2) == [0, 2, 4, 6, 1, 3, 5]


def test_lm_windows_are_contiguous_shifted_and_deterministic():
    tokens = torch.arange(100)
    x, y = lm_windows(tokens, 5, seed=1, batch_size=4, block_size=8)
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y, x + 1)  # targets are the next tokens
    assert torch.equal(x, lm_windows(tokens, 5, seed=1, batch_size=4, block_size=8)[0])
    assert not torch.equal(x, lm_windows(tokens, 6, seed=1, batch_size=4, block_size=8)[0])
    windows = lm_eval_windows(torch.arange(20), 8)
    assert torch.equal(torch.cat([w[1] for w in windows], 1)[0], torch.arange(1, 20))


def test_split_is_deterministic_and_disjoint():
    examples = list(range(100))
    train, valid = split(examples, 0.1, seed=4)
    assert (train, valid) == split(examples, 0.1, seed=4)
    assert len(valid) == 10 and not set(train) & set(valid)
    assert split(examples, 0.1, seed=5)[1] != valid


def test_pad_to_a_multiple_rounds_the_width_up_within_the_cap():
    rows = [[5, 6, 7], [5] * 10]
    assert pad(rows, 0).shape == (2, 10)
    assert pad(rows, 0, multiple=8).shape == (2, 16)
    assert pad(rows, 0, multiple=8, plus=1).shape == (2, 17)  # tgt[:, :-1] is 16 wide
    assert pad(rows, 0, multiple=8, cap=12).shape == (2, 12)  # never past max_len
    assert pad(rows, 0, multiple=8, cap=4).shape == (2, 10)  # nor shorter than a row
    out = pad(rows, 0, multiple=8)
    assert out[0].tolist() == [5, 6, 7] + [0] * 13


def test_padding_to_a_multiple_changes_no_loss_and_no_gradient(tmp_path):
    """A translation batch padded to a multiple of 8 gives the unpadded batch's loss sums and
    gradients: padding is masked in attention and in the loss."""
    from tests import conftest
    from tests.training.fixtures import config, reverse_task
    from vaswani.config import load_run_config
    from vaswani.models import build_model
    from vaswani.tasks import task_for
    from vaswani.training.train import resolve_model

    cfg = load_run_config(config(tmp_path / "c.toml", "encoder-decoder",
                                 reverse_task(tmp_path / "pairs.tsv")))
    task = task_for(cfg)
    data = task.load(tmp_path / "cache")
    cfg = resolve_model(cfg, task, data)
    torch.manual_seed(0)
    model = build_model(cfg.model).double().to(conftest.DEVICE)
    examples = data.train[:16]
    results = []
    for multiple in (0, 8):
        task.config = cfg.replace(data=cfg.data.replace(pad_to_multiple=multiple))
        batch = task.collate(examples).to(conftest.DEVICE)
        model.zero_grad()
        loss, nll, count = task.loss(model, batch, 0.1)
        loss.backward()
        results.append((batch, loss, nll, count, [p.grad.clone() for p in model.parameters()]))
    (plain, *a), (padded, *b) = results
    assert (padded["src"].size(1) % 8, (padded["tgt"].size(1) - 1) % 8) == (0, 0)
    assert padded["src"].size(1) > plain["src"].size(1)
    for x, y in zip(a[:3], b[:3], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10)
    for x, y in zip(a[3], b[3], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-8, atol=1e-10)


def test_batches_are_planned_on_the_host_whatever_torchs_default_device():
    """Batches are drawn and made on the CPU (they meet the device after): with a GPU as
    torch's default device, a CPU generator could not draw for them (found on CUDA; the meta
    device stands in for a GPU here)."""
    tokens = torch.arange(100)
    want = lm_windows(tokens, 5, seed=1, batch_size=4, block_size=8)
    order = [BatchPlan([[i] for i in range(7)], seed=3).indices(i)[0] for i in range(7)]
    with torch.device("meta"):
        got = lm_windows(tokens, 5, seed=1, batch_size=4, block_size=8)
        assert [BatchPlan([[i] for i in range(7)], seed=3).indices(i)[0]
                for i in range(7)] == order
    assert all(torch.equal(a, b) and a.device.type == "cpu" for a, b in zip(got, want, strict=True))
