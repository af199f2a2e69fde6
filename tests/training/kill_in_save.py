"""A test helper: ``vaswani train`` (the arguments) under torchrun, where rank ``KILL_RANK``
kills itself with SIGKILL right after writing its shards in its ``KILL_AT``-th sharded save,
before the save is complete: what a power cut or the OOM killer does mid-save."""

import os
import signal
import sys

from vaswani.cli import main
from vaswani.training import sharding

calls = 0
real_save = sharding.dcp.save


def save(state, checkpoint_id):
    global calls
    calls += 1
    real_save(state, checkpoint_id=checkpoint_id)
    if calls == int(os.environ["KILL_AT"]) and os.environ["RANK"] == os.environ["KILL_RANK"]:
        os.kill(os.getpid(), signal.SIGKILL)


sharding.dcp.save = save
sys.exit(main(sys.argv[1:]))
