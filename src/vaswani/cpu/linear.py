"""``OneDNNLinear``: a linear layer's faster path for inference on a CPU that is not Intel's.

Shapes: (..., in) -> (..., out), as ``nn.Linear``.

On a CPU, ``F.linear`` in float32 calls Intel MKL's sgemm, which runs its AVX-512 kernels on
Intel's CPUs only: on the AMD EPYC machines this project also runs on it picks its AVX2 ones.
oneDNN, also inside PyTorch (what torch.compile's CPU backend calls for a frozen linear
layer), runs AVX-512 there, on a copy of the weight reordered once into its blocked layout:
faster there, slower than MKL on Intel's (figures: docs/performance.md, "The engine's
choices for a CPU"). So on a CPU that is not Intel's (``USE_ONEDNN``), in evaluation mode,
without gradients, in float32, a :class:`OneDNNLinear` multiplies through that copy
(``torch.ops.mkldnn``), the rows padded to a few sizes (:func:`bucket`). A small product
(under ``MIN_MACS`` multiply-adds: a few rows through a small matrix) keeps ``F.linear``, as
oneDNN's call has a fixed cost whatever its size; a large matrix (from ``MIN_WEIGHT``
numbers: a vocabulary projection) takes the copy at one row already. Training, other devices
and dtypes, sharded weights, tracing and a compiled inference graph use ``F.linear``. The
price: a second copy of each weight while it lives.

The copy is made again whenever the weight may have changed: when its version counter moves
(an in-place edit, a load) and whenever the layer is put back in training mode, because a
fused optimizer (``AdamW(fused=True)``, what training uses) writes the weight without moving
its version counter; hence evaluation mode only (``model.eval()``, which vaswani's evaluation
and inference set).

``rows(x, start, stop)`` uses output rows ``start:stop`` of the weight only (multi-head
attention's fused q/k/v projection, whose parts cross-attention uses apart), each part's copy
made once.

A weight that does not train (a LoRA layer's frozen base, a frozen vocabulary projection)
also multiplies through oneDNN while training, on that CPU: forward x W^T, backward only
the input's gradient g W (:func:`frozen_linear`), both on the weight as it is (oneDNN takes a
transposed view: no copy, no second weight in memory). A weight that trains keeps
``F.linear``, its gradient MKL's as before. Under torch.compile (``[train] compile = true``)
these products stay oneDNN's, each one opaque call (:func:`onednn_linear`): Inductor's own
lowering of oneDNN's product takes only a weight it may freeze as a constant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..devices import cpu_is_intel
from ..nn.linear import Linear

MIN_MACS = 1 << 21  # multiply-adds (rows x weight elements) from which oneDNN pays
MIN_WEIGHT = 1 << 19  # weight elements from which it pays at one row already (a vocabulary
# projection; 768 x 256 at one row is faster by F.linear)
ROWS_HINT = 128  # the rows oneDNN lays the copy out for (any number of rows can use it)


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available()


USE_ONEDNN = onednn_available() and not cpu_is_intel()  # see the module's docstring


def bucket(rows: int) -> int:
    """The rows a product is padded to: a power of two up to 32, then a multiple of 32 up to
    512, then of 256. oneDNN makes (compiles) a kernel for every new number of rows, and an
    engine's steps have a different number of rows nearly every time; padded, a run meets a
    few dozen, at most 31 rows of waste per product up to 512 rows (rows are independent:
    the padding changes no other row's result)."""
    if rows <= 32:
        return 1 << max(0, rows - 1).bit_length()
    step = 32 if rows <= 512 else 256
    return -(-rows // step) * step


class OneDNNLinear(Linear):
    onednn = USE_ONEDNN  # multiply through oneDNN's copy where it pays: this CPU's choice,
    #                      which a layer may override (experiments/decode_kernels.py does)

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self._packed: dict[tuple[int, int], tuple[tuple, Tensor]] = {}  # (start, stop) ->
        # (which weight, at which version, it was made from; the reordered rows)

    @classmethod
    def of(cls, linear: nn.Linear) -> OneDNNLinear:
        """A layer over ``linear``'s own parameters (a tied weight stays tied)."""
        with torch.device("meta"):
            layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
        layer.weight, layer.bias = linear.weight, linear.bias
        return layer.train(linear.training)

    def forward(self, x: Tensor) -> Tensor:
        if self._fast(x):
            return self._onednn(x, 0, self.out_features, self.bias)
        if self._frozen(x):
            return frozen_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def train(self, mode: bool = True) -> OneDNNLinear:
        if mode:  # training may change the weight unseen (a fused optimizer): copies go
            self._packed.clear()
        return super().train(mode)

    def rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        bias = None if self.bias is None else self.bias[start:stop]
        if self._fast(x):
            return self._onednn(x, start, stop, bias)
        if self._frozen(x):
            return frozen_linear(x, self.weight[start:stop], bias)
        return super().rows(x, start, stop)

    def _onednn(self, x: Tensor, start: int, stop: int, bias: Tensor | None) -> Tensor:
        m = x.numel() // self.in_features  # rows, padded to a bucket (see bucket())
        flat = x.reshape(m, self.in_features)
        if bucket(m) > m:  # only then a copy of every row, into the bucket's rows (not
            # F.pad, which first fills every row of its output with zeros)
            padded = flat.new_empty(bucket(m), self.in_features)
            padded[:m] = flat
            padded[m:].zero_()
            flat = padded
        out = torch.ops.mkldnn._linear_pointwise(flat, self._reordered(start, stop), bias,
                                                 "none", [], "")
        return out[:m].view(*x.shape[:-1], stop - start)

    def _fast(self, x: Tensor) -> bool:
        """Whether an inference product takes the reordered copy (the module's text)."""
        w = self.weight
        return (self.onednn and not self.training and not torch.is_grad_enabled()
                # first: a compiled graph may not ask what follows (is_inference breaks it);
                # a compiled inference graph is Inductor's to lower (F.linear)
                and not torch.compiler.is_compiling() and _onednn_serves(x, w)
                and (w.numel() >= MIN_WEIGHT
                     or x.numel() // self.in_features * w.numel() >= MIN_MACS)
                and not w.is_inference())  # made under inference_mode: no version to watch

    def _frozen(self, x: Tensor) -> bool:
        """Whether a product under autograd takes :func:`frozen_linear`: a frozen weight (and
        bias), a product of ``MIN_MACS`` or more, outside autocast (which multiplies in
        bfloat16)."""
        w, b = self.weight, self.bias
        return (self.onednn and torch.is_grad_enabled() and not w.requires_grad
                and (b is None or not b.requires_grad) and _onednn_serves(x, w)
                and not torch.is_autocast_enabled("cpu")
                and x.numel() // self.in_features * w.numel() >= MIN_MACS)

    def _reordered(self, start: int, stop: int) -> Tensor:
        w = self.weight
        key = (w.data_ptr(), w._version, w.shape)
        made = self._packed.get((start, stop))
        if made is None or made[0] != key:
            rows = w.detach()[start:stop].contiguous()
            made = (key, torch.ops.mkldnn._reorder_linear_weight(rows, ROWS_HINT))
            self._packed[(start, stop)] = made
        return made[1]


def frozen_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x W^T + b through oneDNN, for a ``weight`` (and ``bias``) that does not train: its
    backward pass gives ``x`` its gradient g W, also through oneDNN, and nothing else (on
    AMD's CPUs faster than MKL's at a training step's hundreds of rows: docs/performance.md,
    "Frozen weights through oneDNN")."""
    return _FrozenProduct.apply(x, weight, bias)


def times_transposed(x: Tensor, weight: Tensor) -> Tensor:
    """x W^T for tensors outside autograd (a frozen head's loss, models/head_loss.py), through
    oneDNN where this CPU's linear layers use it (float32), else ``F.linear``. ``weight`` may
    be a transposed view: ``times_transposed(p, w.T)`` is p W."""
    if OneDNNLinear.onednn and _onednn_serves(x, weight):
        return _onednn_product(x, weight)
    return F.linear(x, weight)


def _onednn_serves(x: Tensor, weight: Tensor) -> bool:
    """What every oneDNN product here needs: float32 on the CPU, a plain weight (not a sharded
    DTensor), outside TorchScript's tracing (which sees ``F.linear``)."""
    return (x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu"
            and not torch.jit.is_tracing() and type(weight.data) is Tensor)


def _onednn_product(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (..., in) W^T (W: (out, in), any strides) + b, one oneDNN call."""
    flat = x.reshape(-1, x.size(-1))
    if torch.compiler.is_compiling():
        out = onednn_linear(flat, weight, bias)
    else:  # the op itself: a custom op's dispatch costs a few microseconds a call
        out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return out.view(*x.shape[:-1], weight.size(0))


@torch.library.custom_op("vaswani::onednn_linear", mutates_args=())
def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (rows, in) W^T + b by oneDNN's product, as one call torch.compile keeps as it is: its
    own lowering of the product (``mkldnn._linear_pointwise``) takes only a weight frozen into
    the graph as a constant, never one passed in, as a training step's are."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@onednn_linear.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty(x.size(0), weight.size(0))


class _FrozenProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(weight)  # not x: the weight's gradient is never made
        return _onednn_product(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        (weight,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return _onednn_product(grad, weight.t()), None, None
