"""LoRA (nn/lora.py) against a float64 reference written as the paper writes it: the layer's
weight W + (alpha / r) B A, used through torch.func.functional_call on the plain module."""

import copy

import pytest
import torch
from torch.func import functional_call
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

from vaswani.config import ModelConfig
from vaswani.config.finetune import TARGETS as CONFIG_TARGETS
from vaswani.models import build_model
from vaswani.nn import FeedForward, Heads, MultiHeadAttention
from vaswani.nn.dropout import dropout
from vaswani.nn.lora import TARGETS, LoRA, adapters, add_lora, merge_lora, parts_of

RANK, ALPHA = 3, 6.0


def _randomize_adapters(module):
    """B starts at zero (the model starts as the base); a trained B is not."""
    with torch.no_grad():
        for p in adapters(module).values():
            p.copy_(torch.randn_like(p))


def _reference(plain, lora_module, x, **kwargs):
    """``plain`` (the module before LoRA) run with each adapted weight replaced by W + (alpha /
    r) B A, as a function of the adapters: its output, and its gradients by A and B."""
    weights = {}
    for attribute in parts_of(plain):
        layer = getattr(lora_module, attribute)
        if not isinstance(layer, LoRA):
            continue
        w = layer.base.weight
        for name, (start, stop) in layer.parts.items():
            delta = torch.zeros_like(w)
            delta[start:stop] = layer.lora_B[name] @ layer.lora_A[name] * (ALPHA / RANK)
            w = w + delta
        weights[f"{attribute}.weight"] = w
    return functional_call(plain, weights, (x,), kwargs)


@pytest.mark.parametrize("targets", [("q", "v"), ("q", "k", "v", "o"), ("k",)])
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_attention_with_adapters_equals_its_merged_weights_and_so_do_gradients(targets,
                                                                               n_kv_heads):
    torch.manual_seed(0)
    plain = MultiHeadAttention(Heads(16, 4, n_kv_heads)).double()
    adapted = copy.deepcopy(plain)
    add_lora(adapted, targets, rank=RANK, alpha=ALPHA)
    _randomize_adapters(adapted)
    x, memory = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 7, 16,
                                                                        dtype=torch.float64)
    for kwargs in ({}, {"memory": memory}):  # self-attention, and cross (in_proj's rows apart)
        out = adapted(x, **kwargs)[0]
        expected = _reference(plain, adapted, x, **kwargs)[0]
        assert_close(out, expected, rtol=1e-10, atol=1e-10)
        grad_out = torch.randn_like(out)
        params = list(adapters(adapted).values())
        ours = torch.autograd.grad(out, params, grad_out)
        theirs = torch.autograd.grad(expected, params, grad_out)
        for name, a, b in zip(adapters(adapted), ours, theirs, strict=True):
            assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)
            assert a.abs().sum() > 0, name  # each adapter learns from this output


@pytest.mark.parametrize("activation,targets", [("swiglu", ("gate", "up", "down")),
                                                ("swiglu", ("up",)), ("relu", ("up", "down"))])
def test_feed_forward_with_adapters_equals_its_merged_weights(activation, targets):
    torch.manual_seed(1)
    plain = FeedForward(16, 24, activation=activation, bias=False).double()
    adapted = copy.deepcopy(plain)
    add_lora(adapted, targets, rank=RANK, alpha=ALPHA)
    _randomize_adapters(adapted)
    x = torch.randn(3, 4, 16, dtype=torch.float64)
    out, expected = adapted(x), _reference(plain, adapted, x)
    assert_close(out, expected, rtol=1e-10, atol=1e-10)
    params = list(adapters(adapted).values())
    for a, b in zip(torch.autograd.grad(out.sum(), params),
                    torch.autograd.grad(expected.sum(), params), strict=True):
        assert_close(a, b, rtol=0, atol=1e-10)


def test_a_model_starts_as_its_base_freezes_it_and_merges_to_the_same_function():
    torch.manual_seed(2)
    config = ModelConfig(arch="decoder", vocab_size=50, d_model=16, n_heads=4, n_kv_heads=2,
                         d_ff=32, n_layers=2, max_len=32, positional="rope", norm="rmsnorm",
                         activation="swiglu", bias=False, norm_first=True)
    model = build_model(config, fast=False).double().eval()
    ids = torch.randint(0, 50, (2, 9))
    before = model(ids)
    wrapped = add_lora(model, TARGETS, rank=RANK, alpha=ALPHA)
    assert len(wrapped) == 2 * 4  # in_proj, out_proj, linear1, linear2 of each layer
    assert_close(model(ids), before, rtol=0, atol=0)  # B = 0: the base model, exactly
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(adapters(model)) and trainable
    _randomize_adapters(model)
    adapted = model(ids)
    assert (adapted - before).abs().max() > 1e-3
    merge_lora(model)
    assert not any(isinstance(m, LoRA) for m in model.modules())
    assert_close(model(ids), adapted, rtol=0, atol=1e-10)


def test_the_config_names_the_targets_nn_knows_and_bad_ones_are_refused():
    assert CONFIG_TARGETS == TARGETS
    attention = MultiHeadAttention(Heads(8, 2))
    with pytest.raises(ValueError, match="must be some of"):
        add_lora(attention, ("q", "query"), rank=2, alpha=2)
    with pytest.raises(ValueError, match="match no layer"):
        add_lora(attention, ("gate",), rank=2, alpha=2)
    with pytest.raises(ValueError, match="rank"):
        LoRA(attention.in_proj, {"q": (0, 8)}, rank=0, alpha=1)


def test_with_dropout_each_part_draws_its_own_mask_in_row_order():
    """As q, k and v are separate layers elsewhere (peft's), each adapted part drops its own
    inputs: the masks are drawn part by part in the order of their rows (what a resumed run
    replays), not one mask shared by the parts."""
    torch.manual_seed(3)
    attention = MultiHeadAttention(Heads(16, 4, 2)).double()
    add_lora(attention, ("q", "k", "v"), rank=RANK, alpha=ALPHA, dropout=0.5)
    _randomize_adapters(attention)
    layer = attention.in_proj.train()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.manual_seed(4)
    out = layer(x)
    torch.manual_seed(4)
    updates = [dropout(x, 0.5) @ layer.lora_A[name].T @ layer.lora_B[name].T * (ALPHA / RANK)
               for name in ("q", "k", "v")]  # q's rows first, then k's, then v's
    assert_close(out, layer.base(x) + torch.cat(updates, dim=-1), rtol=1e-10, atol=1e-10)
    torch.manual_seed(4)
    shared = dropout(x, 0.5)
    one_mask = layer.base(x) + torch.cat(
        [shared @ layer.lora_A[n].T @ layer.lora_B[n].T * (ALPHA / RANK) for n in "qkv"], -1)
    assert (out - one_mask).abs().max() > 1e-3


class _Products(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
            self.shapes.append(tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
        return func(*args, **(kwargs or {}))


def test_the_parts_updates_take_two_products_whatever_their_number():
    """q, k and v's adapters: one product by their stacked A (rank x 3 columns) and one by
    their B down a block diagonal (zero rows for a part not adapted), beside the frozen
    layer's own, rather than two per part and a copy of the output to place them."""
    heads = Heads(16, 4, 2)  # in_proj: 16 q rows, 8 k, 8 v
    for targets, columns in ((("q", "k", "v"), 3 * RANK), (("q", "v"), 2 * RANK)):
        attention = MultiHeadAttention(heads)
        add_lora(attention, targets, rank=RANK, alpha=ALPHA)
        with _Products() as products:
            attention.in_proj(torch.randn(2, 5, 16))
        assert len(products.shapes) == 3, products.shapes
        assert any((16, columns) in shape for shape in products.shapes)  # x by the stacked A
        assert any((columns, 32) in shape for shape in products.shapes)  # by the block B
