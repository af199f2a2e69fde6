"""A CPU's faster ways to run the nn/ building blocks, swapped into a built model.

nn/ holds the Transformer as the paper writes it. On a CPU some of its parts run faster
another way, computing the same function: :func:`fast_paths` replaces them in a built model,
in place, with layers that take over only where they pay and fall back to nn/'s own
otherwise (another device, training, a dtype they do not serve):

* a linear layer through oneDNN on CPUs that are not Intel's (:mod:`.linear`);
* attention choosing per call between SDPA and the written-out products, and a decoding
  step's lean path (:mod:`.attention`);
* dropout drawing one random number per four elements (:mod:`.dropout`);
* RMSNorm under autograd as one node, its backward pass written out (:mod:`.norm`).

``build_model`` applies it (``fast=False`` gives nn/'s modules as written); the parameters,
their names and ties are unchanged, so any checkpoint loads either way. Each fast path has a
test that it equals the module it replaces. :func:`~.quantized.quantize_linears` is the
same kind of pass with int8 / int4 weights, applied on request (``--quantize``).
"""

from __future__ import annotations

from torch import nn

from ..nn.attention import Attention
from ..nn.dropout import Dropout
from ..nn.norm import RMSNorm
from .attention import CPUAttention
from .dropout import LaneDropout
from .linear import OneDNNLinear
from .norm import CPURMSNorm


def fast_path(module: nn.Module) -> nn.Module | None:
    """The faster module that takes ``module``'s place, or None to keep it."""
    if type(module) is Dropout:
        return LaneDropout(module.p).train(module.training)
    if type(module) is Attention:
        return CPUAttention.of(module)
    if isinstance(module, nn.Linear) and not isinstance(module, OneDNNLinear):
        return OneDNNLinear.of(module)
    if type(module) is RMSNorm:
        return CPURMSNorm.of(module)
    return None


def fast_paths(model: nn.Module) -> nn.Module:
    """Every part of ``model`` that has a faster CPU path replaced by it, in place; returns
    ``model``."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            fast = fast_path(child)
            if fast is not None:
                setattr(module, name, fast)
    return model


__all__ = ["fast_path", "fast_paths"]
