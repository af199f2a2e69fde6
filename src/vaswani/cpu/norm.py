"""RMSNorm under autograd as one node, its backward pass written out.

Shape: any (..., D); statistics over the last dim.

nn/'s :class:`~vaswani.nn.norm.RMSNorm` is ``x * rsqrt(mean(x^2) + eps) * w`` as written in
the norm's paper: six operators, each a node of autograd's graph, whose backward passes are
about ten more over the whole activation. Autograd is right, but on a CPU each operator has a
fixed cost, and a LoRA step of SmolLM2 runs 61 of these norms forward and back. Written by
hand, with r = rsqrt(mean(x^2) + eps) and x̂ = x r (kept, with r, from the forward pass), and
s = dy w the gradient that reaches x̂:

    dL/dx = r (s - x̂ mean(s x̂)),      dL/dw = the sum over rows of dy x̂

five operators over the activation (the weight's gradient only when it trains; a LoRA's is
frozen). The forward pass is nn/'s operators in nn/'s order: the same bits. Used under
autograd on the CPU (not under torch.compile, which makes its own backward, nor a trace);
inference runs nn/'s forward as it is.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..nn.norm import RMSNorm


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``x * rsqrt(mean(x^2, -1) + eps) * weight``, one autograd node (see the module)."""
    return _RMSNorm.apply(x, weight, eps)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        r = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
        normalised = x * r
        ctx.save_for_backward(normalised, r, weight)
        return normalised * weight

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        normalised, r, weight = ctx.saved_tensors
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            scaled = grad * weight  # the gradient reaching x̂
            along = (scaled * normalised).mean(dim=-1, keepdim=True)
            grad_x = torch.addcmul(scaled, normalised, along, value=-1).mul_(r)
        if ctx.needs_input_grad[1]:
            grad_weight = (grad * normalised).sum(tuple(range(grad.dim() - 1)))
        return grad_x, grad_weight, None


class CPURMSNorm(RMSNorm):
    """:class:`~vaswani.nn.norm.RMSNorm` through :func:`rms_norm` under autograd on the CPU."""

    @classmethod
    def of(cls, norm: RMSNorm) -> CPURMSNorm:
        """A norm over ``norm``'s own weight."""
        with torch.device("meta"):
            layer = cls(norm.weight.numel(), norm.eps)
        layer.weight = norm.weight
        return layer.train(norm.training)

    def forward(self, x: Tensor) -> Tensor:
        if (torch.is_grad_enabled() and x.device.type == "cpu"
                and not torch.compiler.is_compiling() and not torch.jit.is_tracing()):
            return rms_norm(x, self.weight, self.eps)
        return super().forward(x)
