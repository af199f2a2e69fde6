"""A test helper: ``vaswani train`` (the arguments) under torchrun, where rank 0 fails the
work it does alone at step ``FAIL_STEP``: with ``FAIL=best`` keeping the best weights finds
them non-finite (Diverged, in the evaluation); with ``FAIL=disk`` writing ``last/`` finds the
disk full. The other ranks must stop too, not wait for rank 0 at the next collective."""

import errno
import os
import sys

from vaswani import checkpoint
from vaswani.cli import main
from vaswani.training import state

STEP, FAIL = int(os.environ["FAIL_STEP"]), os.environ["FAIL"]
real_best, real_last = state.Checkpoints.save_best, checkpoint.save_last


def save_best(self, weights, run_state):
    if FAIL == "best" and run_state.step == STEP:
        raise state.Diverged(f"the weights are no longer finite at step {STEP} (test)")
    real_best(self, weights, run_state)


def save_last(run_dir, weights, trainer_state, saved, **kwargs):
    if FAIL == "disk" and saved["step"] == STEP:
        raise OSError(errno.ENOSPC, "No space left on device")
    real_last(run_dir, weights, trainer_state, saved, **kwargs)


state.Checkpoints.save_best, checkpoint.save_last = save_best, save_last
sys.exit(main(sys.argv[1:]))
