"""tests/processes.py: a timed-out command's whole tree is killed, sessions of its own
included (as torchrun starts its ranks)."""

import os
import subprocess
import sys

import pytest

from tests.processes import alive, descendants, run, wait_gone

# a parent that starts a child in a session of its own (as torchrun does), prints the child's
# pid, and waits forever
TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_timeout_kills_the_children_in_sessions_of_their_own():
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run([sys.executable, "-c", TREE], timeout=5)
    child = int(caught.value.stdout.split()[0])
    assert wait_gone([child], timeout=10) == []
    assert not alive(child)


def test_a_command_that_ends_gives_its_output_and_code():
    done = run([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], timeout=30)
    assert (done.returncode, done.stdout) == (3, "out\n")


def test_descendants_finds_grandchildren():
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        child = int(proc.stdout.readline())
        assert child in descendants(proc.pid)
        assert descendants(child) == []
    finally:
        for pid in (child, proc.pid):
            os.kill(pid, 9)
        proc.wait()
