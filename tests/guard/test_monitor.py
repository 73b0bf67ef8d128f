"""The monitor's own judgement of its peers: who counts as dead."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from ddpdoctor.guard.config import GuardConfig
from ddpdoctor.guard.host import this_host
from ddpdoctor.guard.protocol import StoreKeys
from ddpdoctor.guard.rank.liveness import Liveness
from ddpdoctor.guard.rank.monitor import RankMonitor, StoreLink
from ddpdoctor.guard.rank.runtime import GuardRuntime
from ddpdoctor.records import RankRecord


class Clock:
    """A monotonic clock a test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _monitor(world_size: int, clock: Clock | None = None) -> RankMonitor:
    """A monitor as a rank holds one, without the process group and store it would publish to: its
    liveness reads only the records handed to it."""
    monitor = RankMonitor.__new__(RankMonitor)
    monitor.rank, monitor.world_size, monitor.host = 0, world_size, this_host()
    monitor.config = config = GuardConfig(hang_after=10.0)
    monitor.runtime = runtime = GuardRuntime(monitor.config)
    monitor.liveness = Liveness(
        0,
        world_size,
        this_host(),
        heartbeat=config.heartbeat,
        dead_after=config.dead_after,
        resumed=lambda: runtime.resumed,
        clock=clock or time.monotonic,
    )
    return monitor


def test_on_this_host_the_process_decides_and_elsewhere_the_heartbeat() -> None:
    finished = subprocess.Popen(["true"])  # a pid that has exited and been reaped
    finished.wait()
    records = {
        1: RankRecord(1, host=this_host(), pid=os.getpid(), hb=5),  # quiet, alive
        2: RankRecord(2, host="another-node", pid=1, hb=5),  # quiet, on another host
        3: RankRecord(3, host=this_host(), pid=finished.pid, hb=5),  # process gone
        # the same host name on another machine, or in another container's pid namespace: its pid is not ours
        4: RankRecord(4, host=socket.gethostname() + "/0badb007/4026531836", pid=finished.pid, hb=5),
    }
    clock = Clock()
    liveness = _monitor(5, clock).liveness
    assert liveness.dead(records) == {3}  # first look: heartbeats just seen
    clock.now += 10 * liveness.dead_after  # no heartbeat since
    assert liveness.dead(records) == {2, 3, 4}


def test_a_peer_silent_only_while_this_process_was_stopped_is_not_dead() -> None:
    """After a Ctrl-Z and `fg` every rank's last heartbeat is as old as the stop: a peer on another host
    counts as silent from the moment this process ran again, not from before the stop."""
    records = {1: RankRecord(1, host="another-node", pid=1, hb=5)}
    monitor = _monitor(2)
    monitor.liveness.seen = {1: (5, time.monotonic() - 10 * monitor.config.dead_after)}
    monitor._note_stall(late=1.0)  # a heartbeat a little late: the process ran all along
    assert monitor.liveness.dead(records) == {1}
    monitor._note_stall(late=10 * monitor.config.dead_after)  # stopped for longer than dead_after
    assert monitor.liveness.dead(records) == set()


def test_a_heartbeat_late_because_the_machine_is_busy_is_no_stop() -> None:
    """A heartbeat thread that was ready to run but waited for a CPU (a machine at load 15) was not stopped:
    its peers' silence still counts. Measured for real: this thread shares one CPU with two busy processes
    for 3 s, so the process's time on or waiting for a CPU grows by more than half of a 2.1 s lateness; a
    lateness with nothing of the process run or queued behind it (a SIGSTOP, a suspended machine) still
    counts as a stop."""
    import os
    import subprocess

    import pytest

    from ddpdoctor.guard.rank.monitor import scheduled_time

    before = scheduled_time()
    if before is None or not hasattr(os, "sched_setaffinity"):
        pytest.skip("no per-thread schedstat or CPU affinity here")
    cpu = min(os.sched_getaffinity(0))
    spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    mask = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpu})
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            pass  # always ready to run: it runs a third of the time and waits on the run queue the rest
    finally:
        os.sched_setaffinity(0, mask)
        for proc in busy:
            proc.kill()
            proc.wait(timeout=10)
    late = 2.1  # past the stall threshold (2 s, or two heartbeats)
    assert (scheduled_time() or 0.0) - before >= late / 2
    records = {1: RankRecord(1, host="another-node", pid=1, hb=5)}
    monitor = _monitor(2)
    monitor.liveness.seen = {1: (5, time.monotonic() - 10 * monitor.config.dead_after)}
    monitor._note_stall(late=late, scheduled=before)
    assert monitor.liveness.dead(records) == {1}  # starved, not stopped: the peer is still silent
    monitor._note_stall(late=late, scheduled=scheduled_time())  # late, nothing ran or queued: stopped
    assert monitor.liveness.dead(records) == set()


def test_a_pid_namespace_of_its_own_is_another_host() -> None:
    """Two containers on one machine, with one host name: each has its own process table."""
    import shutil

    import pytest

    unshare = shutil.which("unshare")
    probe = [sys.executable, "-c", "from ddpdoctor.guard.host import this_host; print(this_host())"]
    if (
        unshare is None
        or subprocess.run([unshare, "--pid", "--fork", "true"], capture_output=True).returncode
    ):
        pytest.skip("needs `unshare --pid` (root or user namespaces)")
    inside = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", *probe],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    outside = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    assert outside == this_host()
    assert inside != outside and inside.split("/")[:2] == outside.split("/")[:2]


def test_a_waiting_rank_takes_over_only_from_a_judge_that_stopped_heartbeating() -> None:
    import torch.distributed as dist

    link = StoreLink.__new__(StoreLink)  # the guard's keys, in a store of this process
    link.store, link.keys = dist.HashStore(), StoreKeys()
    link.store.set(link.keys.judge, "0")
    monitor = _monitor(2)
    monitor.rank, monitor.link, monitor.is_judge = 1, link, False
    link.publish(0, RankRecord(0, hb=1))
    assert not monitor.claim_judge()
    monitor.liveness.seen[0] = (1, time.monotonic() - 10 * monitor.config.dead_after)  # seen long ago...
    link.publish(0, RankRecord(0, hb=2))  # ...but the judge has beaten since
    assert not monitor.claim_judge()
    monitor.liveness.seen[0] = (2, time.monotonic() - 10 * monitor.config.dead_after)  # now silent that long
    assert monitor.claim_judge() and link.store.get(link.keys.judge) == b"1"


def test_a_peer_that_stopped_heartbeating_is_not_responding_before_it_is_dead() -> None:
    from ddpdoctor.guard.judge.rank_rows import rank_row
    from ddpdoctor.records import RankStatus

    clock = Clock()
    liveness = _monitor(2, clock).liveness
    records = {1: RankRecord(1, host="another-node", pid=1, hb=5)}
    assert liveness.dead(records) == set()  # first look
    clock.now += 3 * liveness.heartbeat + 2
    assert liveness.dead(records) == set()
    seen = liveness.with_silences(records, set())[1]
    assert seen.silent == round(3 * liveness.heartbeat + 2, 1)
    assert rank_row(seen, 1, set()).status is RankStatus.NOT_RESPONDING
    clock.now += liveness.dead_after
    assert liveness.dead(records) == {1}
    records = {1: RankRecord(1, host="another-node", pid=1, hb=6)}  # it beat again
    assert liveness.dead(records) == set()
