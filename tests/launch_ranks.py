"""A thin launcher for the tests whose subject is not the launcher:
`python launch_ranks.py NPROC PORT SCRIPT ARGS...` starts NPROC Pythons running SCRIPT with the environment
torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR=127.0.0.1, MASTER_PORT=PORT) and, like torchrun's agent, stops the survivors (SIGTERM, then
SIGKILL) a tenth of a second after the first rank fails, and exits 1 if any rank failed.

Why not torchrun: its agent imports torch (3.5 of the ~12 CPU-seconds of a guarded 2-rank job on the test
machine), a third of the cost of each of the suite's ~100 guarded jobs. This file imports no torch, so the
guard's bootstrap leaves it alone (it arms itself on `torch.distributed`). The tests of torchrun's own
integration (its agent, its "Root Cause" block, its restarts, its run id, its signal lines) keep real
torchrun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL = 0.05
STOP_AFTER_FAILURE = 0.1  # torchrun's agent polls its workers every 0.1 s
GRACE = 5.0  # between SIGTERM and SIGKILL (torchrun: 30 s; the tests' jobs stop promptly or hang)


def command(script: str, *args: str, nproc: int = 2, port: int) -> list[str]:
    """The command that starts `script args` on `nproc` ranks of a group on 127.0.0.1:port."""
    return [sys.executable, os.path.abspath(__file__), str(nproc), str(port), script, *args]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    alive = [p for p in procs if p.poll() is None]
    for proc in alive:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline and any(p.poll() is None for p in alive):
        time.sleep(POLL)
    for proc in alive:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main(argv: list[str]) -> int:
    nproc, port, script, args = int(argv[0]), argv[1], argv[2], argv[3:]
    procs: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:  # a stopped launcher stops its ranks, as torchrun does
        _stop(procs)
        sys.exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    for rank in range(nproc):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
               "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, script, *args], env=env))
    while True:
        codes = [p.poll() for p in procs]
        if any(code not in (None, 0) for code in codes):
            time.sleep(STOP_AFTER_FAILURE)
            _stop(procs)
            return 1
        if all(code == 0 for code in codes):
            return 0
        time.sleep(POLL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
