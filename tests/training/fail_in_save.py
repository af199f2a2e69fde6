"""A test helper: ``vaswani train`` (the arguments) under torchrun, where rank 0 fails the
work it does alone at step ``FAIL_STEP``: with ``FAIL=best`` keeping the best weights finds
them non-finite (Diverged, in the evaluation); with ``FAIL=disk`` writing ``last/`` finds the
disk full; with ``FAIL=load`` rank 1 fails to read the run's tokenizer while loading the data.
The other ranks must stop too, not wait at the next collective."""

import errno
import os
import sys

from vaswani import checkpoint
from vaswani.cli import main
from vaswani.training import state
from vaswani.training import train as train_module

STEP, FAIL = int(os.environ["FAIL_STEP"]), os.environ["FAIL"]
real_best, real_last = state.Checkpoints.save_best, checkpoint.save_last
real_read_tokenizers = train_module.rundir.read_tokenizers


def save_best(self, weights, run_state):
    if FAIL == "best" and run_state.step == STEP:
        raise state.Diverged(f"the weights are no longer finite at step {STEP} (test)")
    real_best(self, weights, run_state)


def save_last(run_dir, weights, trainer_state, saved, **kwargs):
    if FAIL == "disk" and saved["step"] == STEP:
        raise OSError(errno.ENOSPC, "No space left on device")
    real_last(run_dir, weights, trainer_state, saved, **kwargs)


def read_tokenizers(run_dir):
    if FAIL == "load" and os.environ["RANK"] == "1":
        raise OSError(f"rank 1 could not read {run_dir} (test)")
    return real_read_tokenizers(run_dir)


state.Checkpoints.save_best, checkpoint.save_last = save_best, save_last
train_module.rundir.read_tokenizers = read_tokenizers
sys.exit(main(sys.argv[1:]))
