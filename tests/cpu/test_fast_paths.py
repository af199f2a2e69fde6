"""cpu/__init__.py: the swap pass. A model built with the CPU's fast paths computes what the
same model of nn/'s modules as written computes, with the same parameters, names and ties."""

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import vaswani.cpu.linear
from vaswani import ModelConfig, build_model
from vaswani.cpu import fast_path, fast_paths
from vaswani.cpu.attention import CPUAttention
from vaswani.cpu.dropout import LaneDropout
from vaswani.cpu.linear import OneDNNLinear
from vaswani.cpu.norm import CPURMSNorm
from vaswani.nn.attention import Attention
from vaswani.nn.dropout import Dropout
from vaswani.nn.norm import RMSNorm

pytestmark = pytest.mark.usefixtures("on_cpu")

SMALL = dict(vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=64)
ARCHS = [
    dict(arch="encoder-decoder"),
    dict(arch="decoder", norm_first=True, norm="rmsnorm", activation="swiglu", n_kv_heads=2,
         positional="rope", bias=False),
    dict(arch="encoder", n_classes=3, pooling="cls"),
]


def _pair(arch):
    config = ModelConfig(**SMALL, **arch)
    torch.manual_seed(0)
    fast = build_model(config)
    torch.manual_seed(0)
    plain = build_model(config, fast=False)
    return config, fast, plain


def _ties(model):
    """The names of each parameter (more than one where a weight is tied)."""
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return sorted(names.values())


def _forward(model, config, ids):
    if config.arch == "encoder-decoder":
        return model(ids, ids[:, :-1])[0]
    return model(ids)[0]


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a["arch"])
def test_the_fast_model_equals_the_written_out_one(arch, monkeypatch):
    """Same parameters (names, values, ties), same outputs in inference and in a training
    step's gradients (dropout off: its random numbers are drawn differently); oneDNN forced
    on so that its path is compared on any CPU."""
    monkeypatch.setattr(vaswani.cpu.linear.OneDNNLinear, "onednn", True)
    config, fast, plain = _pair(arch)
    assert list(fast.state_dict()) == list(plain.state_dict())
    for (name, a), b in zip(fast.named_parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b), name
    types = {type(m) for m in fast.modules()}
    assert {CPUAttention, LaneDropout, OneDNNLinear} <= types
    assert not types & {Attention, Dropout, nn.Linear, RMSNorm}
    assert (CPURMSNorm in types) == (config.norm == "rmsnorm")
    assert not {CPUAttention, LaneDropout, OneDNNLinear, CPURMSNorm} & {
        type(m) for m in plain.modules()}
    assert _ties(fast) == _ties(plain)
    assert any(len(names) > 1 for names in _ties(fast)) == (config.arch != "encoder")
    ids = torch.randint(3, 40, (6, 50))  # enough rows and keys for every fast path to act
    with torch.inference_mode():
        assert_close(_forward(fast.eval(), config, ids), _forward(plain.eval(), config, ids),
                     rtol=1e-5, atol=1e-5)
    for model in (fast, plain):
        for m in model.modules():
            if isinstance(m, Dropout):
                m.p = 0.0
            if isinstance(m, Attention):
                m.dropout = 0.0
        model.train()
        _forward(model, config, ids).square().mean().backward()
    for (name, a), b in zip(fast.named_parameters(), plain.parameters(), strict=True):
        assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_run_saved_by_one_loads_in_the_other():
    config, fast, plain = _pair(ARCHS[1])
    with torch.no_grad():
        for p in fast.parameters():
            p.add_(0.01)
    plain.load_state_dict(fast.state_dict())  # strict: every name there, none extra
    ids = torch.randint(3, 40, (2, 9))
    with torch.inference_mode():
        assert_close(fast.eval()(ids)[0], plain.eval()(ids)[0], rtol=1e-5, atol=1e-5)


def test_the_pass_keeps_training_mode_and_leaves_other_modules_alone():
    dropout, attention = Dropout(0.2).eval(), Attention(0.1, "reference").train()
    fast_dropout, fast_attention = fast_path(dropout), fast_path(attention)
    assert not fast_dropout.training and fast_dropout.p == 0.2
    assert fast_attention.training
    assert (fast_attention.dropout, fast_attention.backend) == (0.1, "reference")
    assert fast_path(nn.LayerNorm(4)) is None and fast_path(fast_attention) is None
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    assert fast_paths(model) is model and type(model[0]) is OneDNNLinear
    assert type(model[1]) is nn.ReLU
