"""benchmarks/ports.py: the ports that benchmarks' and tests' servers listen on."""

from pathlib import Path


def test_each_test_worker_takes_its_ports_from_a_block_of_its_own_below_the_kernels(
        monkeypatch):
    """Two pytest-xdist workers' servers never get one port: neither asks the kernel, which
    hands its range to every process's connections and to anyone asking; each takes the next
    free port of its own block, whichever process of the worker asks (a benchmark a test
    starts), and one in use is passed over."""
    import socket
    import subprocess
    import sys

    from benchmarks import ports

    low = ports.ephemeral_ports()[0]
    blocks = {}
    for worker in ("gw7", "gw8"):  # (blocks this suite's own two workers leave alone)
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        first = ports.PORTS + ports.PORT_BLOCK * int(worker[2:])
        given = [ports.free_port() for _ in range(3)]
        assert all(first <= p < first + ports.PORT_BLOCK < low for p in given), given
        assert len(set(given)) == 3  # the next each time: a port just let go is not handed on
        blocks[worker] = given
    assert not set(blocks["gw7"]) & set(blocks["gw8"])
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    first = ports.PORTS + 7 * ports.PORT_BLOCK
    mine = ports.free_port()
    child = subprocess.run([sys.executable, "-c", "from benchmarks.ports import free_port; "
                            "print(free_port())"], capture_output=True, text=True, check=True,
                           cwd=Path(ports.__file__).parents[1])
    theirs = int(child.stdout)  # another process of the worker: the block's next port
    assert theirs == first + (mine + 1 - first) % ports.PORT_BLOCK
    with socket.socket() as server:  # a port in use is passed over
        taken = ports.free_port()
        server.bind(("127.0.0.1", taken))
        server.listen()
        for _ in range(ports.PORT_BLOCK + 1):  # round the whole block
            assert ports.free_port() != taken
