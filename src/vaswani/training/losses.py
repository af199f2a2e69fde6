"""Cross-entropy with label smoothing that respects padding.

With smoothing ``eps`` over a vocabulary of V classes, the target distribution puts ``1 - eps``
on the true class and spreads ``eps`` evenly over the other V - 2 classes that are neither the
true class nor padding (as in the Annotated Transformer); padding positions contribute nothing
and are not counted. The unsmoothed negative log-likelihood is returned beside it, because
perplexity must come from the NLL, not from the smoothed loss.

``torch.nn.functional.cross_entropy(label_smoothing=eps)`` differs: it spreads eps/V over
*all* classes, padding included.
"""

from __future__ import annotations

import torch
from torch import Tensor


def smoothed_cross_entropy(logits: Tensor, target: Tensor, *, smoothing: float = 0.0,
                           pad_id: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """logits (N, V), target (N,) -> (smoothed loss sum, NLL sum, number of counted targets).

    Sums, not means: the caller divides by the token count of the whole optimizer step
    (all micro-batches, all ranks), which is what makes gradient accumulation and DDP exact.
    """
    # bf16/fp16 logits are upcast for the softmax; float64 stays float64.
    logp = logits.log_softmax(dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
    keep = torch.ones_like(target, dtype=torch.bool) if pad_id is None else target != pad_id
    nll = -logp.gather(1, target[:, None]).squeeze(1)  # (N,)
    nll = nll.masked_fill(~keep, 0.0)
    count = keep.sum()
    if smoothing == 0.0:
        return nll.sum(), nll.sum(), count
    V = logits.size(-1)
    others = V - 1 - (0 if pad_id is None else 1)  # classes that share eps
    total = logp.sum(dim=-1)
    if pad_id is not None:
        total = total - logp[:, pad_id]
    rest = -(total + nll)  # -sum of log p over non-target, non-pad classes (nll = -log p_y)
    loss = (1.0 - smoothing) * nll + smoothing / others * rest
    loss = loss.masked_fill(~keep, 0.0)
    return loss.sum(), nll.sum(), count
