"""Ports for the jobs the tests start (torchrun's --master-port, MASTER_PORT, accelerate's
--main_process_port, a TCPStore).

Tests run in parallel lanes (pytest-xdist workers, scripts/test.sh). A port found free by binding port 0 is
a port of the kernel's ephemeral range: between the test closing it and the job's store binding it, a job
of another lane may take it, as the port of a store of its own or as the local end of a connection, and the
store fails with EADDRINUSE. So each lane takes its ports from a block of its own below the ephemeral
range, where the kernel never hands out ports; a port something else already holds is skipped."""

from __future__ import annotations

import itertools
import os
import random
import socket

LANE_PORTS = 1000  # ports in a lane's block; a port comes round again after this many jobs of the lane
FIRST_PORT = 20000  # the first lane's block starts here
MAX_LANES = 8


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def lane() -> int:
    """This pytest process's lane: xdist's worker number (gw0, gw1, ...), 0 without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = worker[2:] if worker.startswith("gw") else ""
    return int(digits) % MAX_LANES if digits.isdigit() else 0


def _block() -> range | None:
    start = FIRST_PORT + lane() * LANE_PORTS
    if start + LANE_PORTS > _ephemeral_floor():
        return None  # the ephemeral range starts lower on this machine: no block is safe
    return range(start, start + LANE_PORTS)


# Start at a random place in the block: two test sessions on one machine rarely meet.
_turn = itertools.count(random.randrange(LANE_PORTS))


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nothing holds now, from this lane's block (from the ephemeral range where there is no
    block)."""
    block = _block()
    if block is not None:
        for _ in range(LANE_PORTS):
            port = block[next(_turn) % LANE_PORTS]
            if _bindable(port):
                return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
