"""One forward pass of a model over the engine's cache (cache.py): what the runner's passes
(runner.py) and the padded decode steps that a GPU captures (graphs.py) both run."""

from __future__ import annotations

import torch
from torch import Tensor

from ..nn import masks
from .cache import SlotCache


def forward_step(model: torch.nn.Module, cache: SlotCache, ids: Tensor, positions: Tensor,
                 slots: Tensor | None, columns: Tensor, width: int, sources: Tensor | None,
                 cross: int | None, last: Tensor) -> Tensor:
    """``model.decode_step`` over the cache: ids and positions (R, T) written to ``columns``
    (R, T) of ``slots`` (None: the first R), ``width`` keys read per row (a translator:
    ``cross`` source keys, ``sources`` (R,) of them real) -> the logits at ``last`` (R, V)."""
    kwargs = {}
    if cache.seq2seq:
        kwargs["memory_mask"] = masks.length_mask(sources, cross)
    return model.decode_step(
        ids, positions=positions, mask=masks.position_mask(positions, width),
        cache=cache.step(slots, columns, width, cross or 0), last=last, **kwargs)
