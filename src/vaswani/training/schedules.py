"""Learning-rate schedules, as multipliers of the peak ``lr`` by optimizer step.

* ``noam`` (the paper, section 5.3): d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), here
  rescaled so that its peak (at ``step == warmup``) is 1; ``step`` is clamped at 1 so step 0
  does not compute 0 ** -0.5.
* ``cosine``: linear warmup to 1, then half a cosine down to ``min_lr / lr`` at ``max_steps``.
* ``constant``: linear warmup to 1, then 1.
* ``wsd`` (warm-up, stable, decay): linear warmup to 1, then 1 until the last ``cooldown``
  fraction of ``max_steps``, then a straight line down to ``min_lr / lr`` at ``max_steps``
  (the shape modded-nanoGPT's Muon runs use).

The schedule is stepped once per optimizer step, never per micro-batch.
"""

from __future__ import annotations

import math

DECAYING = ("cosine", "wsd")  # the schedules that end at min_lr


def lr_factor(step: int, *, schedule: str, warmup: int, max_steps: int,
              min_ratio: float = 0.0, cooldown: float = 0.3) -> float:
    """The multiplier for optimizer step ``step`` (0-based: the first update uses step 0)."""
    if schedule == "noam":
        s = max(step, 1)
        return min(s ** -0.5, s * warmup ** -1.5) * warmup ** 0.5
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "wsd":
        left = (max_steps - step) / max(1.0, cooldown * max_steps)  # 1 as the cooldown starts
        return min_ratio + (1.0 - min_ratio) * min(1.0, max(0.0, left))
    raise ValueError(f"schedule ({schedule!r}) must be 'noam', 'cosine', 'constant' or 'wsd'")
