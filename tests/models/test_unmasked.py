"""Attention that SDPA's flash kernels can take (issue 85): where a batch holds no padding
(a language model's text, a batch of sources of one length) and for a training target's
right padding, the models pass no explicit mask: the causal mask is a ``masks.Causal`` (run
as SDPA's ``is_causal``) and key padding is left out. The losses and gradients equal those of
the explicit masks, in float64, through both attention paths; the tasks ask for it. On a GPU,
tests/cuda/test_cuda.py runs the same steps under the flash kernel alone."""

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from vaswani import ModelConfig, build_model
from vaswani.nn import attention as nn_attention
from vaswani.nn import masks

PAD = 0


def model(arch, backend, **more):
    torch.manual_seed(0)
    config = ModelConfig(**{"arch": arch, "vocab_size": 23, "d_model": 16, "n_heads": 4,
                            "d_ff": 32, "n_layers": 2, "dropout": 0.0, "max_len": 64,
                            "attention": backend, **more})
    return build_model(config).double()


def loss_and_grads(m, run, target):
    m.zero_grad()
    logits = run(m)
    loss = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD,
                           reduction="sum")
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()
                           if p.grad is not None}


def assert_same(a, b):
    assert_close(a[0], b[0], rtol=1e-12, atol=1e-12)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        assert_close(a[1][name], b[1][name], rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
@pytest.mark.parametrize("more", [{}, {"positional": "rope", "norm": "rmsnorm",
                                       "activation": "swiglu", "n_kv_heads": 2}])
def test_a_language_model_without_a_mask_equals_it_with_one(backend, more):
    m = model("decoder", backend, **more)
    ids = torch.randint(3, 23, (3, 17))
    target = torch.randint(3, 23, (3, 17))
    explicit = loss_and_grads(m, lambda m: m(ids, mask=torch.ones_like(ids, dtype=torch.bool)),
                              target)
    causal = loss_and_grads(m, lambda m: m(ids, mask=True), target)
    assert_same(causal, explicit)


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_a_translators_right_padded_targets_need_no_mask(backend):
    """tgt_mask=True (causal alone) over right-padded targets, and src_mask=True over
    sources of one length: the loss and every gradient as with the padding masks."""
    m = model("encoder-decoder", backend)
    src = torch.randint(3, 23, (3, 11))  # one length: no source padding
    tgt = torch.randint(3, 23, (3, 9))
    tgt[0, 6:] = PAD  # right padding, as a training batch's
    tgt[2, 4:] = PAD
    inputs, target = tgt[:, :-1], tgt[:, 1:]
    explicit = loss_and_grads(m, lambda m: m(src, inputs), target)
    bare = loss_and_grads(m, lambda m: m(src, inputs, src_mask=True, tgt_mask=True), target)
    assert_same(bare, explicit)


def test_the_tasks_losses_pass_no_explicit_mask(monkeypatch):
    """What the training step's attention calls receive: a Causal for causal
    self-attention, nothing for unpadded keys; a padded source keeps its key padding mask."""
    from types import SimpleNamespace

    from vaswani.config import TrainConfig
    from vaswani.data.batching import Batch
    from vaswani.tasks.language_model import LanguageModelling
    from vaswani.tasks.translation import Translation

    seen = []
    fused = nn_attention.Attention.fused  # what hands the mask to SDPA

    def spy(self, q, k, v, mask, p):
        seen.append("causal" if isinstance(mask, masks.Causal) else
                    "none" if mask is None else "tensor")
        return fused(self, q, k, v, mask, p)
    monkeypatch.setattr(nn_attention.Attention, "fused", spy)

    lm = model("decoder", "sdpa")
    task = LanguageModelling.__new__(LanguageModelling)
    task.config = SimpleNamespace(train=TrainConfig(), model=lm.config)
    ids = torch.randint(3, 23, (2, 8))
    task.loss(lm, Batch({"input": ids, "target": ids}, targets=16, tokens=16), 0.0)
    assert seen == ["causal", "causal"]

    seen.clear()
    mt = model("encoder-decoder", "sdpa")
    task = Translation.__new__(Translation)
    task.pad_id, task.criterion = PAD, lambda logits, target, **kw: (logits.sum(), 0, 1)
    src, tgt = torch.randint(3, 23, (2, 7)), torch.randint(3, 23, (2, 6))
    task.loss(mt, Batch({"src": src, "tgt": tgt}, targets=10, tokens=26,
                        unpadded=frozenset({"src"})), 0.0)
    # 2 encoder layers (self), 2 decoder layers (self, cross)
    assert seen == ["none", "none", "causal", "none", "causal", "none"]
    seen.clear()
    task.loss(mt, Batch({"src": src, "tgt": tgt}, targets=10, tokens=26), 0.0)
    assert seen == ["tensor", "tensor", "causal", "tensor", "causal", "tensor"]


def test_a_causal_description_builds_the_mask_it_describes():
    for q, k in ((5, 5), (3, 7), (1, 4)):
        assert torch.equal(masks.dense(masks.causal(q, k)), masks.causal_mask(q, k))
    window = torch.ones(5, 5, dtype=torch.bool).triu(-1)
    assert torch.equal(masks.combine(masks.causal(5), window), masks.causal_mask(5) & window)
