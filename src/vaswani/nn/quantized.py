"""int8 linear layers for inference on a CPU, with PyTorch's dynamic-quantization kernels.

Shapes: (..., in) -> (..., out), as ``nn.Linear``.

A weight (out, in) is kept as int8, one scale per output row (symmetric: the row's largest
magnitude maps to 127); on every call the input is quantized to 8 bits with a scale and zero
point from its own range (7 bits, 0..127, as PyTorch's x86 default: fbgemm's AVX2 kernels
would otherwise saturate their 16-bit sums), the product accumulates in int32 and is scaled
back to float, then the float bias is added (``torch.ops.quantized.linear_dynamic``, fbgemm).
:func:`reference_int8_linear` writes the same arithmetic out, and a test checks they agree.

Why: a decode step is mostly its linear layers, and on a CPU with AVX512-VNNI the int8
product is several times faster than the float32 one: the bible preset's model translates
about twice as fast (``python -m benchmarks.offline``, docs/performance.md, offline decoding). The
price is rounding: each weight moves by up to half its row's step, each input by up to half
of its own (the demo model's test BLEU: -0.04 greedy, -0.15 beam 4, ``python -m
benchmarks.export``).

Not for training (no gradients) and not on a GPU (these kernels are CPU-only).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

REDUCE_RANGE = True  # 7-bit inputs (0..127): what fbgemm's AVX2 kernels need to be exact


def quantize_rows(weight: Tensor) -> Tensor:
    """A (out, in) float weight as int8 with one symmetric scale per output row."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).double()
    zeros = torch.zeros(w.size(0), dtype=torch.long)
    with warnings.catch_warnings():  # PyTorch marks its quantized tensors as deprecated
        warnings.simplefilter("ignore", UserWarning)
        return torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8)


class Int8Linear(nn.Module):
    """``nn.Linear`` with an int8 weight (see the module's docstring). ``rows(x, start,
    stop)`` uses only output rows ``start:stop`` of the weight (multi-head attention's fused
    projection, whose parts cross-attention uses apart); each part is packed once."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.qweight = quantize_rows(weight)
        self.bias = None if bias is None else bias.detach().float().clone()
        self._packed: dict[tuple[int, int], object] = {}

    @classmethod
    def of(cls, linear: nn.Linear) -> Int8Linear:
        return cls(linear.weight, linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.rows(x, 0, self.out_features)

    def rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """x (..., in) -> (..., stop - start): the output rows ``start:stop``."""
        packed = self._packed.get((start, stop))
        if packed is None:
            bias = None if self.bias is None else self.bias[start:stop]
            packed = torch.ops.quantized.linear_prepack(self.qweight[start:stop], bias)
            self._packed[(start, stop)] = packed
        return torch.ops.quantized.linear_dynamic(x.float(), packed, REDUCE_RANGE)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def reference_int8_linear(x: Tensor, qweight: Tensor, bias: Tensor | None) -> Tensor:
    """The arithmetic of :class:`Int8Linear`, written out: x quantized per tensor to 0..127
    from its range (0 always representable), times the dequantized weight, plus the bias."""
    qmax = 127 if REDUCE_RANGE else 255
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = max((high - low) / qmax, 1e-12)
    zero = int(min(max(round(-low / scale), 0), qmax))
    xq = (torch.round(x / scale) + zero).clamp(0, qmax)  # the 8-bit input
    return F.linear((xq - zero) * scale, qweight.dequantize(), bias)


def quantize_linears(model: nn.Module) -> nn.Module:
    """Every ``nn.Linear`` in ``model`` (the attention projections, the feed-forward layers,
    the vocabulary projection) replaced by an :class:`Int8Linear`, in place; returns
    ``model``. The model must be on a CPU, in float32, for inference."""
    param = next(model.parameters(), None)
    if param is not None and param.device.type != "cpu":
        raise ValueError(f"int8 runs on a CPU; the model is on {param.device}")
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8Linear.of(child))
    return model.eval()
