"""One forward pass of a model over the engine's cache (cache.py): what the runner's passes
(runner.py) and the padded decode steps that a GPU captures (graphs.py) both run."""

from __future__ import annotations

import torch
from torch import Tensor

from ..nn import masks
from .cache import SlotCache
from .plan import StepPlan


def forward_step(model: torch.nn.Module, cache: SlotCache, ids: Tensor, positions: Tensor,
                 last: Tensor | None, plan: StepPlan) -> Tensor:
    """``model.decode_step`` over the cache as ``plan`` lays it out: ids and positions (R, T)
    -> the logits at ``last`` (R, V; None: at every position, (R, T, V)). Every pass has a
    self-attention mask, even where it hides nothing: a row's bits must not depend on
    whether the rows beside it are in step with it (the kernels differ with and without)."""
    kwargs = {}
    if cache.seq2seq:
        kwargs["memory_mask"] = None if plan.lengths is None else \
            masks.length_mask(plan.lengths, plan.cross)
    mask = masks.position_mask(positions, plan.width)
    return model.decode_step(ids, positions=positions, mask=mask, cache=cache.step(plan),
                             last=last, **kwargs)
