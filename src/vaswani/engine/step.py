"""One forward pass of a model over the engine's cache (cache.py): what the runner's passes
(runner.py) and the padded decode steps that a GPU captures (graphs.py) both run."""

from __future__ import annotations

import torch
from torch import Tensor

from ..nn import masks
from .cache import SlotCache


def forward_step(model: torch.nn.Module, cache: SlotCache, ids: Tensor, positions: Tensor,
                 slots: Tensor | None, columns: Tensor, width: int, last: Tensor, *,
                 lengths: Tensor | None = None, cross: int = 0, sources: Tensor | None = None,
                 groups: tuple[Tensor, Tensor] | None = None,
                 parts: list[tuple[int, int, int]] | None = None,
                 column: int | None = None,
                 self_parts: list[tuple[int, int, int]] | None = None) -> Tensor:
    """``model.decode_step`` over the cache: ids and positions (R, T) written to ``columns``
    (R, T) of ``slots`` (None: the first R; with ``column``, all to that one column),
    ``width`` keys read per row -> the logits at ``last`` (R, V). A translator reads
    ``cross`` keys of its sources: of source slots ``sources`` (R,) by index, or of the
    leading source slots in place, grouped as ``groups`` says (cache.py
    ``SlotCache.groups``), in ``parts`` (``SlotCache.parts``) or in one pass; ``lengths``
    are the real tokens of each source read ((R,), or (G,) when grouped; None: each is ``cross``
    long, and its keys are read without a mask). ``self_parts``:
    the first R slots' own keys read in parts (cache.py ``parts``).

    With ``column`` the rows are in step: each attends to all ``width`` = ``column + 1``
    keys, so no self-attention mask is made (a padding row riding along reads its slot's
    keys too; its output is thrown away)."""
    kwargs = {}
    if cache.seq2seq:
        kwargs["memory_mask"] = None if lengths is None else masks.length_mask(lengths, cross)
    in_step = column is not None and width == column + 1 and ids.size(1) == 1
    return model.decode_step(
        ids, positions=positions, mask=None if in_step else masks.position_mask(positions, width),
        cache=cache.step(slots, columns, width, cross, sources, groups, parts, column,
                         self_parts),
        last=last, **kwargs)
