"""Several LoRA adapters over one base model (engine/adapters.py): a row computes with its own
request's adapter, as that adapter's own model computes it, whatever the rows beside it use;
no row computes without a choice made."""

import copy

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from tests.conftest import DEVICE
from tests.engine.test_draft import small_model
from tests.engine.test_speculate import decode
from vaswani.engine import Engine, Params, Request
from vaswani.engine.adapters import attach, choose
from vaswani.nn.lora import adapters, add_lora, merge_lora, remove_lora

TARGETS = {1: ("q", "v"), 2: ("q", "k", "v", "o", "gate", "up", "down")}


def adapter(model: nn.Module, seed: int, targets) -> dict:
    """A LoRA of ``targets`` with random A and B (B nonzero: it changes the model), taken
    off ``model`` again: {layer name: LoRA}."""
    torch.manual_seed(seed)
    add_lora(model, targets, rank=4, alpha=8.0)
    for p in adapters(model).values():
        nn.init.normal_(p, std=0.2)
    return remove_lora(model)


def with_adapter(base: nn.Module, taken: dict) -> nn.Module:
    """A copy of ``base`` with one adapter's LoRA layers in it: that adapter's own model."""
    model = copy.deepcopy(base)
    for name, lora in taken.items():
        parent, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent), attribute, copy.deepcopy(lora))
    return model.eval()


@pytest.fixture()
def models():
    """(a model serving adapters 1 and 2, {k: adapter k's own model}, {k: merged})."""
    base = small_model(0, activation="swiglu", n_kv_heads=1)
    taken = {k: adapter(base, k, targets) for k, targets in TARGETS.items()}
    own = {0: copy.deepcopy(base), **{k: with_adapter(base, t) for k, t in taken.items()}}
    merged = {k: merge_lora(copy.deepcopy(m)) for k, m in own.items()}
    attach(base, [taken[1], taken[2]])
    return base.eval(), own, merged


def test_each_row_computes_with_its_own_adapter(models):
    served, own, merged = models
    ids = torch.randint(3, 300, (4, 12), device=DEVICE)
    with torch.no_grad():
        for k in (0, 1, 2):
            with choose(served, k):
                logits = served(ids, mask=True)
            assert torch.equal(logits, own[k](ids, mask=True))  # the unmerged model's bits
            assert_close(logits, merged[k](ids, mask=True))  # = the merged model's
        assert (own[1](ids, mask=True) - own[0](ids, mask=True)).abs().max() > 1e-2
        rows = [2, 0, 1, 2]  # a batch of all three, each row as its adapter's model has it
        with choose(served, rows, DEVICE):
            mixed = served(ids, mask=True)
        for i, k in enumerate(rows):
            assert_close(mixed[i], own[k](ids[i:i + 1], mask=True)[0])


def test_a_model_serving_adapters_refuses_a_pass_with_none_chosen(models):
    served, *_ = models
    ids = torch.randint(3, 300, (2, 5), device=DEVICE)
    with pytest.raises(RuntimeError, match="no adapter was chosen"):
        served(ids, mask=True)
    with choose(served, [1, 2, 0], DEVICE), pytest.raises(RuntimeError, match="3 rows"):
        served(ids, mask=True)


def test_the_engine_decodes_each_request_with_its_adapter_in_shared_batches(models):
    """Requests for adapters 1, 2 and the base, greedy and sampled, decoded together: each
    gets the tokens its adapter's merged model gives it alone."""
    served, _, merged = models
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 300, (5 + 3 * i,), generator=g, device="cpu").tolist()
               for i in range(6)]
    params = [Params(max_new_tokens=12, logprobs=2),
              Params(max_new_tokens=9, temperature=0.8, seed=4)]
    chosen = [1, 2, 0, 2, 1, 1]
    engine = Engine(served, bos_id=1, eos_id=2)
    requests = [Request(p, params[i % 2], adapter=chosen[i]) for i, p in enumerate(prompts)]
    engine.run(requests)
    assert engine.steps < sum(r.generated for r in requests)  # their rows shared steps
    for i, request in enumerate(requests):
        [(alone, logprobs, _)], _ = decode(merged[chosen[i]], [prompts[i]], [params[i % 2]])
        assert request.output == alone
        for (ours, top), (theirs, their_top) in zip(request.logprobs, logprobs, strict=True):
            assert ours == pytest.approx(theirs, abs=1e-9)
            assert [t for t, _ in top] == [t for t, _ in their_top]
