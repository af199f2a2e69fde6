"""Learning-rate schedules, as multipliers of the peak ``lr`` by optimizer step.

* ``noam`` (the paper, section 5.3): d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), here
  rescaled so that its peak (at ``step == warmup``) is 1; ``step`` is clamped at 1 so step 0
  does not compute 0 ** -0.5.
* ``cosine``: linear warmup to 1, then half a cosine down to ``min_lr / lr`` at ``max_steps``.
* ``constant``: linear warmup to 1, then 1.
* ``wsd`` (warm-up, stable, decay): linear warmup to 1, then 1 until the last ``cooldown``
  fraction of ``max_steps``, then a straight line down to ``min_lr / lr`` at ``max_steps``
  (the shape modded-nanoGPT's Muon runs use).

The schedule is stepped once per optimizer step, never per micro-batch. :func:`check_schedule`
checks a run's schedule against its length before it trains (new or resumed).
"""

from __future__ import annotations

import math
import sys

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


def check_schedule(t, say: bool = True) -> None:
    """A decaying schedule (cosine, wsd) shorter than the run: refused where the steps past
    its end would change nothing (min_lr 0) or where it ends still warming up (the rate
    would climb past its end); otherwise said. A run that ends inside its warmup (the
    default warmup, 100 steps, in a short fine-tune) is said too: its rate never reaches
    ``lr``. ``say``: whether to print what is said (one process of a multi-process run
    does; every one refuses)."""
    if t.warmup >= t.max_steps and t.max_steps <= t.schedule_steps and t.warmup and say:
        print(f"vaswani: warning: train.warmup ({t.warmup}) is not shorter than max_steps "
              f"({t.max_steps}): the learning rate rises for the whole run and reaches "
              f"{t.max_steps / t.warmup:.0%} of lr ({t.lr:g}) at the last step; set "
              "train.warmup below max_steps for the run to train at lr",
              file=sys.stderr, flush=True)
    if not (t.max_steps > t.schedule_steps and t.schedule in DECAYING):
        return
    if t.warmup >= t.schedule_steps:
        raise ValueError(f"train.warmup ({t.warmup}) is not shorter than the {t.schedule} "
                         f"schedule (schedule_steps {t.schedule_steps}), and max_steps "
                         f"({t.max_steps}) goes past its end: the rate would still be warming "
                         "up there. Shorten warmup, or set schedule_steps to max_steps")
    if t.min_lr == 0:
        raise ValueError(
            f"train.max_steps ({t.max_steps}) goes past the end of this run's {t.schedule} "
            f"schedule ({t.schedule_steps} steps), where the learning rate is min_lr (0): "
            f"the extra steps would change nothing. Also --set train.schedule_steps="
            f"{t.max_steps} to stretch the schedule over them (the rate rises again), "
            "or set train.min_lr")
    if say:
        print(f"vaswani: steps {t.schedule_steps + 1}-{t.max_steps} run after the end of the "
              f"{t.schedule} schedule, at min_lr ({t.min_lr:g}); --set train.schedule_steps="
              f"{t.max_steps} would stretch the schedule instead", file=sys.stderr, flush=True)
