"""The layer stack (nn/layers.py): activations recomputed in the backward pass give the
gradients kept ones give, with the stack's input frozen (LoRA over a frozen embedding) too,
and leave no per-operation graph behind in the forward pass."""

import pytest
import torch
from torch.testing import assert_close

from vaswani.config import ModelConfig
from vaswani.models import build_model


def _model(layers: int, recompute: bool):
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="decoder", vocab_size=50, d_model=32, n_heads=4,
                                    d_ff=64, n_layers=layers, dropout=0.0, norm_first=True,
                                    positional="rope"))
    model.decoder.checkpoint_activations = recompute
    for name, p in model.named_parameters():  # the stack trains, its input is frozen
        p.requires_grad_(name.startswith("decoder.layers"))
    return model.train()


def _nodes(output: torch.Tensor) -> int:
    """How many autograd records the forward pass left behind ``output``."""
    seen, todo = set(), [output.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)


def _translator(recompute: bool):
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=50, d_model=32, n_heads=4, d_ff=64,
                                    n_layers=2, dropout=0.0))
    model.encoder.checkpoint_activations = model.decoder.checkpoint_activations = recompute
    return model.train()


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_recomputed_layers_give_the_gradients_of_kept_ones(arch):
    """A language model's stack over a frozen embedding; a translator's decoder, whose
    cross-attention carries the gradient back to the encoder's (recomputed) layers."""
    ids = torch.randint(1, 50, (2, 12))
    grads = []
    for recompute in (False, True):
        if arch == "decoder":
            model = _model(3, recompute)
            out = model(ids, mask=True)
        else:
            model = _translator(recompute)
            out = model(ids, ids.flip(1))
        out.square().mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert grads[1].keys() == grads[0].keys() and all(g is not None for g in grads[1].values())
    assert_close(grads[1], grads[0])


@pytest.mark.parametrize("recompute, most", [(True, 2), (False, None)])
def test_a_recomputed_layer_leaves_one_record_in_the_forward_graph(recompute, most):
    """Each further layer adds at most ``most`` autograd records when recomputed (the
    layer's own operations would leave dozens of small records among its large freed
    temporaries, which glibc's heap then cannot reuse: 12 MB more resident memory a layer
    for SmolLM2's LoRA step, benchmarks/finetune.py)."""
    ids = torch.randint(1, 50, (2, 12))
    counts = [_nodes(_model(n, recompute)(ids, mask=True)) for n in (2, 6)]
    per_layer = (counts[1] - counts[0]) / 4
    if most is None:
        assert per_layer > 10  # the check can tell: kept activations leave many
    else:
        assert per_layer <= most
