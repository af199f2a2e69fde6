"""The mixture of experts (nn/moe.py) against a written-out reference: each token alone,
its top-k experts' outputs summed with their router probabilities; and the same sums where
shapes may not depend on the data (traced, compiled)."""

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import vaswani.nn.moe
from vaswani.nn.feedforward import FeedForward
from vaswani.nn.moe import MixtureOfExperts, Router, load_balancing_loss


def mixture(renormalize: bool, n: int = 5, k: int = 2) -> MixtureOfExperts:
    torch.manual_seed(0)
    moe = MixtureOfExperts(Router(16, n), [FeedForward(16, 8, activation="swiglu", bias=False)
                                           for _ in range(n)], top_k=k, renormalize=renormalize)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return moe.eval()


def by_token(moe: MixtureOfExperts, x):
    """Each token on its own: softmax over the experts, the k highest, their outputs
    weighted (and the weights renormalised where asked)."""
    out = torch.zeros_like(x)
    for b in range(x.size(0)):
        for t in range(x.size(1)):
            token = x[b, t]
            p = F.softmax(moe.router.weight @ token, dim=-1)
            top = sorted(range(len(p)), key=lambda e: -p[e].item())[:moe.top_k]
            total = sum(p[e] for e in top) if moe.renormalize else 1.0
            out[b, t] = sum(p[e] / total * moe.experts[e](token) for e in top)
    return out


@pytest.mark.parametrize("renormalize", [False, True])
def test_each_token_is_its_top_k_experts_weighted(renormalize):
    moe = mixture(renormalize)
    x = torch.randn(3, 7, 16)
    got = moe(x)
    assert_close(got, by_token(moe, x), atol=1e-5, rtol=1e-5)
    chosen = moe.route(x.reshape(-1, 16))[2]
    assert chosen.unique().numel() == 5  # every expert is somebody's: the test sees them all


def test_traced_and_compiled_give_the_same_sums():
    """Where shapes may not depend on the data every expert runs on every row, unchosen
    ones weighted 0: the same outputs under the tracer (ONNX's), torch.compile (whole) and
    torch.export."""
    moe = mixture(True)
    x = torch.randn(2, 6, 16)
    expected = moe(x)
    traced = torch.jit.trace(moe, x)
    assert_close(traced(x), expected, atol=1e-5, rtol=1e-5)
    other = torch.randn(2, 6, 16)  # routed otherwise: the trace did not bake in a choice
    assert_close(traced(other), moe(other), atol=1e-5, rtol=1e-5)
    compiled = torch.compile(moe, backend="eager", fullgraph=True)
    assert_close(compiled(x), expected, atol=1e-5, rtol=1e-5)
    exported = torch.export.export(moe, (x,)).module()  # what `vaswani compile` traces with
    assert_close(exported(other), moe(other), atol=1e-5, rtol=1e-5)


def test_a_compiled_mixture_never_asks_cuda_whether_it_is_capturing(monkeypatch):
    """On a machine with a GPU the compiled mixture broke its graph on
    ``torch.cuda.is_current_stream_capturing`` (an H200): compiling must decide from
    ``is_compiling`` alone. Here the question to CUDA fails wherever it is asked."""

    def capturing():
        raise AssertionError("asked CUDA whether a graph is being captured")

    moe = mixture(False)
    x = torch.randn(2, 6, 16)
    expected = moe(x)
    monkeypatch.setattr(vaswani.nn.moe, "capturing_cuda_graph", capturing)
    compiled = torch.compile(moe, backend="eager", fullgraph=True)
    assert_close(compiled(x), expected, atol=1e-5, rtol=1e-5)


def test_router_scores_kept_for_the_loss_only_while_training():
    moe = mixture(False)
    x = torch.randn(2, 3, 16)
    moe(x)
    assert moe.router_logits is None
    moe.train()
    with torch.no_grad():
        moe(x)
    assert moe.router_logits is None
    moe(x)
    assert moe.router_logits.shape == (6, 5)
    loss = load_balancing_loss([moe.router_logits], moe.top_k)
    loss.backward()
    assert moe.router.weight.grad.abs().sum() > 0  # balancing trains the router


def test_balanced_routing_costs_k_and_crowding_more():
    """E * sum f_e P_e: k (here 2) when every expert takes an equal share with equal
    probability, more when the tokens crowd onto the same experts."""
    uniform = [torch.zeros(8, 4)]
    assert_close(load_balancing_loss(uniform, 2), torch.tensor(2.0))
    crowded = [torch.tensor([[5.0, 4.0, 0.0, 0.0]]).repeat(8, 1)]
    assert load_balancing_loss(crowded, 2) > 3.5


def test_top_k_must_fit_the_experts():
    with pytest.raises(ValueError, match="top_k"):
        MixtureOfExperts(Router(4, 2), [FeedForward(4, 4), FeedForward(4, 4)], top_k=3)
