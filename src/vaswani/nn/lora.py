"""LoRA (Hu et al. 2021): a frozen linear layer plus a trainable low-rank update.

Shapes: x (..., in) -> (..., out), as the layer it wraps.

Fine-tuning every weight of a pretrained model stores a gradient and two optimizer moments
per weight. LoRA freezes W and learns its change as a product of two thin matrices:

    y = x W^T + b + (alpha / r) * dropout(x) A^T B^T,     A: (r, in), B: (out, r)

with r (the rank) much smaller than in and out. A starts random and B at zero, so the
model starts as the pretrained one; only A and B are trained and saved.

vaswani's attention keeps W_q, W_k and W_v stacked in one matrix (``in_proj``) and a gated
feed-forward its gate and up projections (``linear1``): a LoRA layer may adapt *parts* of
its output rows, each part with an A and a B of its own, so that q, k and v (or gate and
up) each learn their own update, as they do where they are separate layers. ``merged``
folds the update into W: the same function, at the frozen layer's cost.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .dropout import Dropout
from .feedforward import FeedForward

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # what a LoRA may adapt, by name


class LoRA(nn.Module):
    """``base`` (a linear layer: ``forward`` and ``rows(x, start, stop)``, kept frozen) plus
    a rank-``rank`` update on each named part (``parts``: name -> (start, stop) output
    rows), scaled by ``alpha / rank``, with dropout on its input."""

    def __init__(self, base: nn.Module, parts: dict[str, tuple[int, int]], *, rank: int,
                 alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank ({rank}) must be >= 1")
        self.base = base.requires_grad_(False)
        self.parts = dict(parts)
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        self.in_features, self.out_features = base.in_features, base.out_features
        weight = getattr(base, "weight", None)  # none where it is quantized (QLoRA)
        float_weight = weight is not None and weight.is_floating_point()
        make = dict(device=weight.device if weight is not None else None,
                    dtype=weight.dtype if float_weight else torch.float32)
        self.lora_A = nn.ParameterDict({name: nn.Parameter(torch.empty(rank, self.in_features,
                                                                       **make))
                                        for name in self.parts})
        self.lora_B = nn.ParameterDict({name: nn.Parameter(torch.zeros(stop - start, rank,
                                                                       **make))
                                        for name, (start, stop) in self.parts.items()})
        self.dropout = Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A drawn (:meth:`draw_a`); B zero."""
        for a in self.lora_A.values():
            self.draw_a(a)
        for b in self.lora_B.values():
            nn.init.zeros_(b)

    @staticmethod
    def draw_a(a: Tensor) -> Tensor:
        """An A, in place: as ``nn.Linear`` draws its weight (Kaiming-uniform, as peft does)."""
        return nn.init.kaiming_uniform_(a, a=math.sqrt(5))

    def delta(self, x: Tensor, start: int, stop: int) -> Tensor | None:
        """The update of output rows ``start:stop`` for ``x``: (alpha / r) dropout(x) A^T B^T
        for each adapted part that falls inside them, zero between them; None where none
        does. The parts' A are stacked and their B set down a block diagonal, so that q, k
        and v's updates come out of two products, already side by side, rather than six and
        a copy (without dropout one product by A for all: with it each part draws its own
        mask, as separate layers do)."""
        inside = sorted((max(lo, start), min(hi, stop), name)
                        for name, (lo, hi) in self.parts.items() if max(lo, start) < min(hi, stop))
        if not inside:
            return None
        a = [self.lora_A[name] for _, _, name in inside]
        if self.training and self.dropout.p > 0:
            h = torch.cat([F.linear(self.dropout(x).to(w.dtype), w) for w in a], dim=-1)
        else:
            h = F.linear(x.to(a[0].dtype), a[0] if len(a) == 1 else torch.cat(a))
        blocks, at = [], start  # B's rows for each part, empty blocks (zero rows) between
        for lo, hi, name in inside:
            if lo > at:
                blocks.append(h.new_zeros(lo - at, 0))
            skip = lo - self.parts[name][0]  # rows of the part before ``start``
            blocks.append(self.lora_B[name][skip:skip + hi - lo])
            at = hi
        if at < stop:
            blocks.append(h.new_zeros(stop - at, 0))
        b = blocks[0] if len(blocks) == 1 else torch.block_diag(*blocks)
        return F.linear(h * self.scale, b)

    def forward(self, x: Tensor) -> Tensor:
        return self.rows(x, 0, self.out_features)

    def rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Output rows ``start:stop`` (cross-attention projects its queries and its memory
        apart), each adapted part that falls inside them with its update added."""
        whole = (start, stop) == (0, self.out_features)
        return self.added(x, self.base(x) if whole else self.base.rows(x, start, stop),
                          start, stop)

    def added(self, x: Tensor, y: Tensor, start: int, stop: int) -> Tensor:
        """``y``, the base layer's output rows ``start:stop`` for ``x``, with the update of
        each adapted part that falls inside them added (one addition: its backward hands
        ``y`` its gradient as it is)."""
        delta = self.delta(x, start, stop)
        return y if delta is None else y + delta

    @torch.no_grad()
    def merged(self) -> nn.Module:
        """The base layer with every part's update folded into its weight (W += (alpha / r)
        B A): the same function without the adapters (dropout aside)."""
        if not isinstance(getattr(self.base, "weight", None), Tensor):
            raise ValueError("LoRA adapters merge into a float weight; this layer's is "
                             "quantized: merge into the float model they were trained on")
        for name, (start, stop) in self.parts.items():
            delta = (self.lora_B[name] @ self.lora_A[name]) * self.scale
            self.base.weight[start:stop] += delta.to(self.base.weight.dtype)
        return self.base

    def extra_repr(self) -> str:
        return f"parts={list(self.parts)}, rank={self.rank}, alpha={self.alpha:g}"


def parts_of(module: nn.Module) -> dict[str, dict[str, tuple[int, int]]]:
    """For an attention or feed-forward module, each of its linear layers' adaptable parts:
    {layer attribute: {target: (start, stop) rows}}; {} for any other module."""
    if isinstance(module, MultiHeadAttention):
        q, kv = module.heads.q_dim, module.heads.kv_dim
        return {"in_proj": {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)},
                "out_proj": {"o": (0, module.out_proj.out_features)}}
    if isinstance(module, FeedForward):
        d_ff = module.linear2.in_features
        first = {"gate": (0, d_ff), "up": (d_ff, 2 * d_ff)} if module.gated else \
            {"up": (0, d_ff)}
        return {"linear1": first, "linear2": {"down": (0, module.linear2.out_features)}}
    return {}


def add_lora(model: nn.Module, targets: tuple[str, ...], *, rank: int, alpha: float,
             dropout: float = 0.0) -> list[str]:
    """Freeze every parameter of ``model`` and wrap its attention and feed-forward linear
    layers whose parts are named in ``targets`` (:data:`TARGETS`) in :class:`LoRA`, in
    place; returns the names of the wrapped layers. Only the adapters are left trainable."""
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown or not targets:
        raise ValueError(f"LoRA targets ({list(targets)}) must be some of {list(TARGETS)}")
    model.requires_grad_(False)
    wrapped = []
    for prefix, module in list(model.named_modules()):
        for attribute, parts in parts_of(module).items():
            chosen = {name: rows for name, rows in parts.items() if name in targets}
            if chosen:
                setattr(module, attribute, LoRA(getattr(module, attribute), chosen, rank=rank,
                                                alpha=alpha, dropout=dropout))
                wrapped.append(f"{prefix}.{attribute}" if prefix else attribute)
    if not wrapped:
        raise ValueError(f"LoRA targets ({list(targets)}) match no layer of this model")
    return wrapped


def merge_lora(model: nn.Module) -> nn.Module:
    """Every :class:`LoRA` layer of ``model`` replaced by its merged base layer, in place;
    returns ``model``."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRA):
                setattr(module, name, child.merged())
    return model


def remove_lora(model: nn.Module) -> dict[str, LoRA]:
    """Every :class:`LoRA` layer of ``model`` replaced by its base layer, unchanged, in
    place; returns the LoRA layers by name (``layers.0.self_attn.in_proj``), their bases
    still inside them."""
    removed = {}
    for prefix, module in list(model.named_modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRA):
                setattr(module, name, child.base)
                removed[f"{prefix}.{name}" if prefix else name] = child
    return removed


def adapters(model: nn.Module) -> dict[str, Tensor]:
    """The LoRA parameters of ``model`` by name (``...in_proj.lora_A.q``)."""
    return {name: p for name, p in model.named_parameters()
            if ".lora_A." in name or ".lora_B." in name}
