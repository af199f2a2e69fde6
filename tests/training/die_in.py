"""A test helper: ``vaswani train`` (the arguments) under ``torchrun --max-restarts``, where
one rank kills itself with SIGKILL in each attempt but the last, at a moment ``DIE`` plans:
``DIE="1:step:5,0:save:8,0:eval:15"`` kills rank 1 in the first attempt during step 5, rank
0 in the second (restart 1) while saving step 8, rank 0 in the third while evaluating step
15. What a lost machine or the OOM killer does to one process of a job.

``wait`` kills the rank as it starts waiting for rank 0's evaluation of that step, which
rank 0 makes last ``SLOW`` seconds (so that rank 0 is busy when its peer dies). With ``ONCE``
set to a file's path, a rank dies only if that file does not exist yet, and makes it: once
in the whole job, whatever attempt each node's torchrun counts (several nodes' counts differ
once one of them has restarted).
"""

import os
import signal
import sys
import time
from pathlib import Path

from vaswani import checkpoint
from vaswani.cli import main
from vaswani.training import loop, state

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
plan = [part.split(":") for part in os.environ["DIE"].split(",")]
rank, moment, step = (plan[attempt][0], plan[attempt][1], int(plan[attempt][2])) \
    if attempt < len(plan) else (None, None, None)
me = os.environ["RANK"] == rank


def die() -> None:
    if os.environ.get("ONCE"):
        if Path(os.environ["ONCE"]).exists():
            return
        Path(os.environ["ONCE"]).touch()
    print(f"die_in.py: rank {rank} killed in attempt {attempt}, {moment} {step}",
          file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


real_step, real_save, real_evaluate, real_eval_step = (
    loop.Trainer.train_step, state.Checkpoints.save, loop.Trainer.evaluate,
    loop.Trainer._eval_step)
real_save_weights = checkpoint.save_weights


def train_step(self):
    if me and moment == "step" and self.state.step + 1 == step:
        die()
    return real_step(self)


saving = False


def save(self, model, optimizer, run_state):
    global saving
    saving = me and moment == "save" and run_state.step == step
    return real_save(self, model, optimizer, run_state)


def save_weights(weights, path, metadata=None):
    """Rank 0 writing ``last.tmp/``: the weights are written, the rest never is."""
    real_save_weights(weights, path, metadata)
    if saving and path.parent.name == "last.tmp":
        die()


def evaluate(self, model=None):
    if me and moment == "eval" and self.state.step == step:
        die()
    return real_evaluate(self, model)


def eval_step(self):
    if moment == "wait" and self.state.step == step:
        if me:
            die()
        elif self.dist.is_main:
            time.sleep(float(os.environ.get("SLOW", "0")))
    return real_eval_step(self)


loop.Trainer.train_step, state.Checkpoints.save, loop.Trainer.evaluate = (
    train_step, save, evaluate)
loop.Trainer._eval_step = eval_step
checkpoint.save_weights = save_weights
sys.exit(main(sys.argv[1:]))
