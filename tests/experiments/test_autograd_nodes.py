"""experiments/autograd_nodes.py: nn/'s RMSNorm and rotation and the one-node ones timed on
equal outputs and gradients, and a LoRA step's two norms alternating on the same losses
(timing is never asserted)."""

import pytest

from experiments import autograd_nodes
from tests.training.fixtures import text_file
from tests.training.test_lora import _config
from vaswani.training.train import Launch, train


def test_the_one_node_rotation_is_nn_s_to_the_bit_with_autograd_s_gradient():
    import torch

    from vaswani.nn.rotary import Rotary

    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    leaves = [t.clone().requires_grad_() for t in (q, k, q, k)]
    want = Rotary(8)(leaves[0], leaves[1], torch.arange(5))
    got = autograd_nodes.one_node_rotary(8)(leaves[2], leaves[3], torch.arange(5))
    assert all(torch.equal(w, g) for w, g in zip(want, got, strict=True))
    grads = [torch.randn_like(t) for t in want]
    for w, g in zip(torch.autograd.grad(want, leaves[:2], grads),
                    torch.autograd.grad(got, leaves[2:], grads), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_each_piece_is_timed_both_ways():
    rows = autograd_nodes.pieces(rows=256, d=32, heads=(4, 2), head_dim=8, repeats=1, calls=1)
    assert list(rows) == ["RMSNorm (frozen), 256 rows x 32", "RMSNorm (weight trains), 256 "
                          "rows x 32", "rotary, q and k (4 + 2 heads of 8, 256 rows)"]
    for r in rows.values():
        assert r["nn_ms"] > 0 and r["one_node_ms"] > 0 and r["nn_over_one_node"] > 0


def test_a_lora_step_alternates_the_two_ways_and_restores_cpus(tmp_path, monkeypatch):
    """Each way's first step and its two timed ones: cpu/'s one-node norm runs in three of
    the six steps only, and its class is left as it was."""
    import vaswani.cpu.norm
    from vaswani import rundir
    from vaswani.cpu.norm import CPURMSNorm

    forward = CPURMSNorm.forward
    data = text_file(tmp_path / "text.txt")
    train(str(_config(tmp_path / "base.toml", data, max_steps=1)), [],
          out=str(tmp_path / "base"), launch=Launch(progress=False))
    calls = []
    one_node = vaswani.cpu.norm.rms_norm
    monkeypatch.setattr(vaswani.cpu.norm, "rms_norm", lambda *a: calls.append(1) or one_node(*a))
    step = autograd_nodes.lora_step(tmp_path / "base", rounds=2, length=16)
    norms = 2 * rundir.read_config(tmp_path / "base").model.n_layers + 1
    assert len(calls) == 3 * norms
    assert step["pairs"] == 2 and len(step["ratios"]) == 2
    assert step["losses"]["nn"] == pytest.approx(step["losses"]["one_node"], rel=1e-6)
    assert step["nn_best_s"] > 0 and step["one_node_best_s"] > 0
    assert CPURMSNorm.forward is forward
