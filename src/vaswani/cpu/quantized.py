"""Linear layers with int8 or int4 weights for inference on a CPU, with PyTorch's own kernels.

Shapes: (..., in) -> (..., out), as ``nn.Linear``.

Two ways, for two kinds of work:

* :class:`WeightOnlyLinear` (``int8`` and ``int4`` for a language model): the weight is kept
  in 8 or 4 bits and the input stays float; PyTorch's CPU kernels
  (``torch.ops.aten._weight_int8pack_mm``, ``_weight_int4pack_mm_for_cpu``) read the small
  weight and multiply it by the input rounded to bfloat16 (8 significant bits), each input row
  on its own. A row's result depends only on that row, so a completion is the same alone and
  in any batch (a test checks it bit for bit), and a decode step, which reads every weight
  for a few rows, reads a quarter (int8) or an eighth (int4) of the bytes. int8: one
  symmetric scale per output row; int4: a scale and an offset per group of ``GROUP`` (32)
  inputs of each output row (asymmetric: 16 levels from the group's least to its largest
  value), or of 64 (``int4-g64``). The kernel is compute-bound at a prompt's many rows (its
  product of 256 rows is slower than float32's), so an engine asked to (``EngineConfig``
  ``bf16_prefill``, ``--fast-prefill``) runs its prefills' int8 products otherwise where the
  CPU multiplies bfloat16 natively (oneDNN with AVX512-BF16 or AMX, :func:`bf16_products`):
  the levels widened to bfloat16 (exactly: integers below 128), one bfloat16 product with
  float32 sums, each output scaled after (:func:`widened_product`, under :func:`widened`):
  the kernel's arithmetic up to the order of the sums and one rounding, each row's bits its
  own, faster from a dozen rows or so (docs/performance.md). But not the decoding step's
  bits, so the engine widens by role, not by pass (engine/runner.py): a prompt's tokens
  always widened (a prompt of ``WIDEN_FROM`` tokens or more), generated tokens always by
  the kernel, and a completion stays the same to the bit alone and in any batch. A
  vocabulary head, which a prefill reads for one row a prompt, keeps the kernel (``wide``
  False).
* :class:`~vaswani.cpu.dynamic.Int8Linear` (``int8`` for a translator or an encoder,
  cpu/dynamic.py): int8 weights and inputs quantized on every call, fbgemm's int32 products.

Not on a GPU (these kernels are CPU-only). Not for training their weights either: a
:class:`WeightOnlyLinear` passes a gradient to its input only (:class:`FrozenProduct`), so
that LoRA adapters can be trained over it (QLoRA). What each costs in quality and buys in
speed: docs/performance.md.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.positional import Embeddings
from .dynamic import Int8Linear, reference_int8_linear  # noqa: F401 (both importable here too)

GROUP = 32  # int4: inputs per scale and offset (llama.cpp's Q4 blocks hold 32 too)
# each int4 choice's group: "int4" is llama.cpp's Q4 groups, "int4-g64" reads 10% fewer bytes
INT4_GROUPS = {"int4": GROUP, "int4-g64": 64}


ROWS = 4096  # rows quantized at a time: a vocabulary-sized weight's temporaries stay small


def int8_rows(weight: Tensor | Iterable[Tensor], shape: torch.Size | None = None
              ) -> tuple[Tensor, Tensor]:
    """A (out, in) weight as (int8 (out, in), one symmetric scale per output row (out,)),
    ``ROWS`` rows at a time; or the same of its rows given in blocks, in order, with its
    ``shape`` (a table read a block at a time is never whole in float)."""
    shape = weight.shape if shape is None else shape
    blocks = weight.split(ROWS) if isinstance(weight, Tensor) else weight
    q = torch.empty(shape, dtype=torch.int8)
    scales = torch.empty(shape[0])
    a = 0
    for block in blocks:  # each row is quantized alone: blocks give the whole's levels
        w, b = block.detach().float(), a + len(block)
        s = _as_kernel_reads((w.abs().amax(dim=1) / 127).clamp_min(1e-12))
        q[a:b] = torch.round(w / s[:, None]).clamp(-127, 127)
        scales[a:b] = s
        a = b
    if a != shape[0]:
        raise ValueError(f"a weight of {shape[0]} rows came with {a}")
    return q, scales


def _as_kernel_reads(values: Tensor) -> Tensor:
    """``values`` rounded to the bfloat16 the kernels read them in (kept as float32): the
    levels are then chosen against the scales the kernel will use, not against more exact
    ones it never sees (that cost SmolLM2's int4 0.5 of perplexity)."""
    return values.to(torch.bfloat16).float()


def int4_groups(weight: Tensor, group: int = GROUP) -> tuple[Tensor, Tensor, Tensor]:
    """A (out, in) weight as (levels 0..15 (out, in) int32, scales and offsets (out, in /
    group)): each group of ``group`` inputs of a row spans its least to its largest value in 16
    steps. The value of level q is ``(q - 8) * scale + offset`` (the kernel's convention)."""
    w = weight.detach().float().view(weight.size(0), -1, group)  # (out, groups, group)
    low, high = w.amin(-1), w.amax(-1)
    scales = _as_kernel_reads(((high - low) / 15).clamp_min(1e-12))
    offsets = _as_kernel_reads(low + 8 * scales)
    levels = torch.round((w - (offsets - 8 * scales)[..., None]) / scales[..., None])
    return levels.clamp(0, 15).to(torch.int32).view(weight.shape), scales, offsets


def int4_packed(weight: Tensor, group: int = GROUP) -> tuple[Tensor, Tensor]:
    """(the kernel's packed int4 weight, its (in / group, out, 2) bf16 scales and offsets),
    ``ROWS`` output rows at a time (each row is packed on its own)."""
    packed, pairs = [], []
    for a in range(0, weight.size(0), ROWS):
        levels, scales, offsets = int4_groups(weight[a:a + ROWS], group)
        packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels, 1))
        pairs.append(torch.stack([scales, offsets], -1).transpose(0, 1).to(torch.bfloat16))
    return torch.cat(packed), torch.cat(pairs, dim=1).contiguous()


INT8_INPUTS = 16  # the int8 kernel reads a row's inputs in eights (AVX2), sixteens (AVX-512)


def int8_fits(in_features: int) -> bool:
    """Whether PyTorch's weight-only int8 kernel takes a layer of ``in_features`` inputs. It
    reads each weight row in blocks past a shorter row's end, of 8 on an AVX2 CPU (36 inputs
    give wrong sums) and of 16 on an AVX-512 one (36 or 40 inputs end the process, SIGSEGV).
    Such a layer stays in float (:func:`quantized`)."""
    return in_features % INT8_INPUTS == 0


def int4_fits(linear: nn.Linear, group: int = GROUP) -> bool:
    """Whether PyTorch's int4 kernel takes this layer: inputs in whole groups, outputs in
    sixteens."""
    return linear.in_features % group == 0 and linear.out_features % 16 == 0


WIDEN: ContextVar[bool] = ContextVar("widen_int8", default=False)
# an engine widens a prompt of at least this many tokens, whichever pass computes which of
# them (engine/request.py ``Request.wide``): below about a dozen rows widening the weights
# costs more than the kernel's whole product
WIDEN_FROM = 16


@contextmanager
def widened(on: bool = True) -> Iterator[None]:
    """Inside, with ``on``, every int8 :class:`WeightOnlyLinear` but a head multiplies by
    :func:`widened_product` where the CPU has bfloat16 products (an engine's prefill, asked
    for: see the module)."""
    token = WIDEN.set(on)
    try:
        yield
    finally:
        WIDEN.reset(token)


@functools.cache
def bf16_products() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (oneDNN's AVX512-BF16 or AMX
    kernels). Elsewhere a bfloat16 product is several times slower than the int8 kernel."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def widened_product(flat: Tensor, qweight: Tensor, scales: Tensor) -> Tensor:
    """(N, in) bfloat16 inputs times an int8 (out, in) weight with one scale per output row,
    -> (N, out) float32: the levels widened to bfloat16 (exact), one bfloat16 product with
    float32 sums (rounded once, to bfloat16), then each output scaled in float32."""
    return F.linear(flat, qweight.to(torch.bfloat16)).float().mul_(scales.float())


class WeightOnlyLinear(nn.Module):
    """``nn.Linear`` with an int8 or int4 weight and a float input (see the module's
    docstring): ``bits`` 8 or 4, the latter in groups of ``group`` inputs. ``wide``: an
    int8 layer takes :func:`widened_product` under :func:`widened` (False: a head)."""

    wide = True  # a class default: layers pickled before it had one

    def __init__(self, weight: Tensor, bias: Tensor | None, bits: int,
                 group: int = GROUP) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bits, self.group = bits, group
        self.bias = None if bias is None else bias.detach().float().clone()
        if bits == 8:
            self.qweight, scales = int8_rows(weight)
            self.scales = scales.to(torch.bfloat16)
        elif bits == 4:
            # (in / group, out, 2) scales: each group's scale and offset, as the kernel reads
            self.qweight, self.scales = int4_packed(weight, group)
        else:
            raise ValueError(f"bits ({bits}) must be 8 or 4")

    @classmethod
    def of(cls, linear: nn.Linear, bits: int, group: int = GROUP) -> WeightOnlyLinear:
        return cls(linear.weight, linear.bias, bits, group)

    @classmethod
    def sharing(cls, table: Int8Embedding) -> WeightOnlyLinear:
        """A tied output head over the int8 rows of its token table (no second copy): the
        head keeps the table's 8 bits whatever the other layers' (as llama.cpp keeps a Q4
        model's output tensor in more bits)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.out_features, layer.in_features = table.qweight.shape
        layer.bits, layer.group, layer.bias = 8, GROUP, None
        layer.qweight, layer.scales = table.qweight, table.scales.to(torch.bfloat16)
        layer.wide = False  # a head: one row a prompt in a prefill
        return layer

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)  # (N, in)
        if torch.is_grad_enabled() and flat.requires_grad:  # adapters train beneath (QLoRA)
            y = FrozenProduct.apply(flat, self)
        else:
            y = self.product(flat)
        y = y.to(x.dtype if x.is_floating_point() else torch.float32)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def product(self, flat: Tensor) -> Tensor:
        """(N, in) -> (N, out) in bfloat16 (float32 :func:`widened`): the kernel's product,
        without the bias."""
        flat = flat.to(torch.bfloat16)
        if self.bits == 8 and self.wide and WIDEN.get() and bf16_products():
            return widened_product(flat, self.qweight, self.scales)
        if self.bits == 8:
            return torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scales)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.qweight, self.group,
                                                          self.scales)

    def dequantized(self) -> Tensor:
        """The (out, in) float32 weight the kernel multiplies by (what
        :func:`reference_weight_only` computes from the float weight)."""
        if self.bits == 8:
            return self.qweight.float() * self.scales.float()[:, None]
        scales, offsets = self.scales.float().unbind(-1)  # (in / group, out) each
        w = int4_unpacked(self.qweight, self.out_features, self.in_features, torch.float32)
        w = w.view(self.out_features, -1, self.group)  # in place: one weight-sized block a
        w.sub_(8).mul_(scales.T[..., None]).add_(offsets.T[..., None])  # call (QLoRA's
        return w.view(self.out_features, self.in_features)  # backward makes one per layer)

    def dequantized_rows(self, start: int, stop: int) -> Tensor:
        """Rows ``start:stop`` of :meth:`dequantized`, made alone where the weight is int8 (a
        tied head's table, read a block of words at a time: models/head_loss.py)."""
        if self.bits == 8:
            return self.qweight[start:stop].float() * self.scales[start:stop].float()[:, None]
        return self.dequantized()[start:stop]

    def rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Output rows ``start:stop`` (cross-attention's parts; a language model has none)."""
        return self.forward(x)[..., start:stop]

    def extra_repr(self) -> str:
        groups = f" in groups of {self.group}" if self.bits == 4 else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int{self.bits} weights{groups}")


class FrozenProduct(torch.autograd.Function):
    """A :class:`WeightOnlyLinear`'s product with a gradient for its input alone (the weight
    is frozen): backward multiplies by the dequantized weight, one layer's at a time, so no
    float copy of the model is kept. The input's rounding to bfloat16 passes the gradient
    through unchanged, as QLoRA's does."""

    @staticmethod
    def forward(ctx, flat: Tensor, layer: WeightOnlyLinear) -> Tensor:
        ctx.layer = layer
        return layer.product(flat).to(flat.dtype)  # the gradient comes back in this dtype

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return (grad.float() @ ctx.layer.dequantized()).to(grad.dtype), None


def int4_unpacked(packed: Tensor, out_features: int, in_features: int,
                  dtype: torch.dtype = torch.int32) -> Tensor:
    """The (out, in) levels 0..15 of a weight :func:`int4_packed` packed: the kernel's CPU
    layout, each ``ROWS`` rows apart, holds blocks of ``n`` rows as [in][n / 2] bytes (rows j
    and j + n / 2 of the block in the low and high half of byte j; n is 64 where PyTorch runs
    its AVX-512 kernels, 32 elsewhere: :func:`int4_block`) and the last out % n rows as
    [in][rows / 2] (rows 2j and 2j + 1). Checked against the kernel's packing in the tests.
    ``dtype``: the levels' (float32 straight from the bytes where they are multiplied next)."""
    n = int4_block()
    blocks, at = [], 0
    for first in range(0, out_features, ROWS):
        rows = min(ROWS, out_features - first)
        for size, half in ((rows // n * n, n // 2), (rows % n, None)):
            if not size:
                continue
            part = packed.reshape(-1)[at:at + size * in_features // 2]
            at += part.numel()
            if half:  # (blocks, in, n / 2): rows j | j + n / 2
                b = part.view(size // n, in_features, half)
                levels = torch.cat([b & 0xF, b >> 4], -1).permute(0, 2, 1)
            else:  # (in, rows / 2): rows 2j | 2j + 1
                b = part.view(in_features, size // 2)
                levels = torch.stack([b & 0xF, b >> 4], -1).reshape(in_features, size).T
            blocks.append(levels.reshape(size, in_features))
    return torch.cat(blocks).to(dtype)


def int4_block() -> int:
    """The output rows PyTorch's int4 kernel packs together on this CPU: 64 with its AVX-512
    kernels, 32 with its AVX2 ones (the capability it dispatches to, which
    ``ATEN_CPU_CAPABILITY`` may lower)."""
    return 64 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 32


def reference_weight_only(x: Tensor, layer: WeightOnlyLinear, weight: Tensor) -> Tensor:
    """What :class:`WeightOnlyLinear` computes, written out from the float ``weight`` it was
    made of: the weight rounded as its ``bits`` say, times the input rounded to bfloat16."""
    if layer.bits == 8:
        q, scales = int8_rows(weight)
        w = q.float() * scales.to(torch.bfloat16).float()[:, None]
    else:
        levels, scales, offsets = int4_groups(weight, layer.group)
        s, o = (t.to(torch.bfloat16).float()[..., None] for t in (scales, offsets))
        w = ((levels.view(*scales.shape, layer.group).float() - 8) * s + o).view(weight.shape)
    return F.linear(x.to(torch.bfloat16).float(), w, layer.bias)


class Int8Embedding(nn.Module):
    """A token table (``nn.Embedding``'s weight, (V, D)) in int8 rows, one symmetric scale
    per row (:func:`int8_rows`): a lookup gives ``levels * scale`` in float32. A language
    model's table is its largest tensor (Gemma 3 270M: 262,144 x 640) and is read a row per
    token, so it is kept in a quarter of the bytes."""

    def __init__(self, weight: Tensor | Iterable[Tensor], shape: torch.Size | None = None
                 ) -> None:
        """``weight`` (V, D), or its rows in blocks with ``shape``, as :func:`int8_rows`."""
        super().__init__()
        self.qweight, self.scales = int8_rows(weight, shape)
        self.num_embeddings, self.embedding_dim = self.qweight.shape

    def forward(self, ids: Tensor) -> Tensor:
        return self.qweight[ids].float() * self.scales[ids].unsqueeze(-1)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 rows"


QUANTIZE = ("int8", *INT4_GROUPS)


def quantize_linears(model: nn.Module, kind: str = "int8", *, weight_only: bool = False
                     ) -> nn.Module:
    """Every ``nn.Linear`` in ``model`` (the attention projections, the feed-forward layers,
    the vocabulary projection) replaced in place, for inference on a CPU; returns ``model``.
    With ``weight_only`` the token table too (:class:`Int8Embedding`), and a head tied to it
    shares its int8 rows (:meth:`WeightOnlyLinear.sharing`).
    ``kind`` "int8": :class:`WeightOnlyLinear` with ``weight_only`` (a language model), else
    :class:`Int8Linear`; "int4": :class:`WeightOnlyLinear` of 4 bits (a layer the kernel does
    not take, :func:`int4_fits`, keeps 8). A layer whose inputs the weight-only int8 kernel
    cannot take (:func:`int8_fits`) stays in float, and so does a token table that a head
    would share. The model must be on a CPU, in float32."""
    if kind not in QUANTIZE:
        raise ValueError(f"quantize ({kind!r}) must be one of {', '.join(QUANTIZE)}")
    param = next(model.parameters(), None)
    if param is not None and param.device.type != "cpu":
        raise ValueError(f"{kind} runs on a CPU; the model is on {param.device}")
    tables = {}  # a language model's token table: int8 rows, which a tied head shares
    for module in list(model.modules()) if weight_only else []:
        if isinstance(module, Embeddings) and int8_fits(module.token.embedding_dim):
            tables[id(module.token.weight)] = module.token = Int8Embedding(module.token.weight)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                table = tables.get(id(child.weight))
                setattr(module, name, WeightOnlyLinear.sharing(table) if table is not None
                        else quantized(child, kind, weight_only=weight_only))
    return narrow_head(model).eval()


HEAD = "output_proj"  # a model's vocabulary projection (models/common.py)


def narrow_head(model: nn.Module) -> nn.Module:
    """The model's int8 vocabulary head keeps the kernel in a prefill too (``wide`` False):
    a prefill reads it for one row a prompt, where widening its levels costs more than the
    kernel's whole product (docs/performance.md). Returns ``model``."""
    head = getattr(model, HEAD, None)
    if isinstance(head, WeightOnlyLinear):
        head.wide = False
    return model


def quantized(linear: nn.Linear, kind: str, *, weight_only: bool = False) -> nn.Module:
    """One layer of :func:`quantize_linears` (``linear`` itself where no kernel takes it)."""
    group = INT4_GROUPS.get(kind)
    if group and int4_fits(linear, group):
        return WeightOnlyLinear.of(linear, 4, group)
    if (group or weight_only) and not int8_fits(linear.in_features):
        return linear
    if group:
        return WeightOnlyLinear.of(linear, 8)
    if weight_only:
        return WeightOnlyLinear.of(linear, 8)
    return Int8Linear.of(linear)
