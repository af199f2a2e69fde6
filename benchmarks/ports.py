"""Ports for the servers and rendezvous that benchmarks (and tests) start: :func:`free_port`."""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
from pathlib import Path

PORTS, PORT_BLOCK = 10_000, 1_000  # free_port's blocks: the first port, ports a block


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing uses now, for a server or a rendezvous started
    next. Not one the kernel picks (``bind`` to port 0): the kernel hands out the same range
    to every process's connections and to other processes asking the same way, and a port
    it gave may be given again before the server binds it. A port of a block of its own
    below that range instead: under pytest-xdist each worker's (``PYTEST_XDIST_WORKER``,
    gw0, gw1, ...), elsewhere the first; each call, from this process or any other of the
    block (a benchmark a test starts), takes the block's next port (a counter in a file,
    under a lock) that binds (none in use, none closing), so no port is handed out twice in
    a row of a thousand. Where the kernel's range leaves no room below it
    (``ip_local_port_range``), the kernel's pick."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    first = PORTS + PORT_BLOCK * (int(worker[2:]) if worker[2:].isdigit() else 0)
    if first + PORT_BLOCK <= ephemeral_ports()[0]:
        counter = Path(tempfile.gettempdir()) / f"vaswani-ports-{os.getuid()}-{first}"
        with open(counter, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            given = int(f.read().strip() or 0)
            for n in range(given + 1, given + 1 + PORT_BLOCK):
                port = first + n % PORT_BLOCK
                with socket.socket() as s:
                    try:
                        s.bind(("127.0.0.1", port))
                    except OSError:  # in use, or closing (TIME_WAIT)
                        continue
                f.seek(0)
                f.truncate()
                f.write(str(n % PORT_BLOCK))
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ephemeral_ports() -> tuple[int, int]:
    """The range of ports the kernel picks from (Linux's ``ip_local_port_range``; its
    default where that cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999
