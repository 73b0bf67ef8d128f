"""The guard's store protocol at 1,024 ranks, simulated: no worker processes, the real protocol code.

    .venv/bin/python benchmarks/guard_scale.py [--ranks 1024] [--seconds 4]

A real `TCPStore` (server in this process) carries what 1,024 ranks' monitors would send: each simulated
rank's heartbeat runs the monitor's own calls (`StoreLink.read_control`, `StoreLink.publish` of a
`RankRecord`, `ChainCheck.publish` of its completed collectives, four per heartbeat), through one client
connection that counts operations. After a few heartbeats every rank enters `barrier` #100 except rank 17,
which enters `all_reduce` #100; a judge then runs what a rank's monitor runs once it has waited past the
grace period (`claim_judge`'s `compare_set`, `StoreLink.read_all`, `decide`) on a client of its own, while
the crowd's heartbeats go on. Printed: store operations per rank per second (and per heartbeat), whether
one store kept up with the crowd, and the time from the divergence to the verdict, with its parts.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import socket
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from ddpdoctor.guard.fingerprint import CollectiveFingerprint, CollectiveSignature  # noqa: E402
from ddpdoctor.guard.judge.verdict import decide  # noqa: E402
from ddpdoctor.guard.protocol import Control, StoreKeys  # noqa: E402
from ddpdoctor.guard.rank.consensus import ChainCheck  # noqa: E402
from ddpdoctor.guard.rank.store_link import StoreLink  # noqa: E402
from ddpdoctor.records import Frame, RankRecord, RankState  # noqa: E402

HEARTBEAT = 0.5
GRACE = 0.75
OUTLIER = 17


class Counting:
    """A store client that counts the operations made through it."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.ops: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.ops[name] += 1
            return method(*args, **kwargs)

        return counted


def link_over(store: Any, keys: StoreKeys) -> StoreLink:
    link = StoreLink.__new__(StoreLink)  # its __init__ clones torch's default store, which is not here
    link.store = store
    link.keys = keys
    return link


def signature(op: str, line: int) -> CollectiveSignature:
    return CollectiveSignature("0", op, "SUM" if op == "all_reduce" else None, None,
                               [[4]] if op == "all_reduce" else [], ["float32"] if op == "all_reduce" else [],
                               ["cpu"], Frame("/job/train.py", line, "main", None), None)


def record(rank: int, hb: int, current: CollectiveFingerprint | None, waited: float | None) -> RankRecord:
    return RankRecord(rank, pid=100000 + rank, host=f"node{rank // 8}", hb=hb, state=RankState.RUNNING,
                      current=current.record() if current is not None else None, waited=waited,
                      seqs={"0": current.seq if current is not None else 99})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=4.0, help="heartbeats before the divergence")
    args = parser.parse_args()
    import torch.distributed as dist

    world = args.ranks
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=30))
    keys = StoreKeys()
    crowd_store = Counting(dist.TCPStore("127.0.0.1", port, is_master=False,
                                         timeout=datetime.timedelta(seconds=30)))
    crowd = link_over(crowd_store, keys)
    crowd.init()
    chains = [ChainCheck(rank) for rank in range(world)]
    steady = signature("all_reduce", 30)
    index = [0]
    diverged = threading.Event()
    entered: dict[int, CollectiveFingerprint] = {}
    hb = [0]
    periods: list[float] = []

    def heartbeat() -> None:
        """One heartbeat of every rank: the monitor's tick, in the monitor's calls."""
        hb[0] += 1
        for rank in range(world):
            control = crowd.read_control()
            if control.state is Control.VERDICT:
                return
            current = entered.get(rank)
            waited = time.monotonic() - since[0] if current is not None else None
            crowd.publish(rank, record(rank, hb[0], current, waited))
            if current is None:  # four collectives completed since the last heartbeat
                chain = chains[rank]
                for _ in range(4):
                    index[0] += 1
                    fp = CollectiveFingerprint(index[0], hb[0] * 4, time.time(), steady)
                    fp.state = "done"
                    chain.update(fp)  # the monitor's fold of the calls since its last heartbeat
                chain.publish(crowd_store, keys)

    since = [0.0]

    def crowd_loop() -> None:
        while not stop.is_set():
            start = time.monotonic()
            heartbeat()
            took = time.monotonic() - start
            periods.append(max(took, HEARTBEAT))
            stop.wait(max(0.0, HEARTBEAT - took))

    stop = threading.Event()
    thread = threading.Thread(target=crowd_loop, daemon=True)
    thread.start()
    time.sleep(args.seconds)
    counts = dict(crowd_store.ops)
    steady_ops = sum(counts.values())
    # The divergence: every rank enters barrier #100, rank 17 all_reduce #100.
    since[0] = time.monotonic()
    barrier, odd = signature("barrier", 10), signature("all_reduce", 12)
    for rank in range(world):
        call = odd if rank == OUTLIER else barrier
        entered[rank] = CollectiveFingerprint(10**6 + rank, 100, time.time(), call)
    diverged.set()
    # The judge: rank 0's monitor wakes once its wait passes the grace period (monitor._next_wait), then
    # runs its tick: its own record, the judge's claim, every record, the decision.
    judge_store = Counting(dist.TCPStore("127.0.0.1", port, is_master=False,
                                         timeout=datetime.timedelta(seconds=30)))
    judge = link_over(judge_store, keys)
    time.sleep(max(0.0, since[0] + GRACE + 0.01 - time.monotonic()))
    tick = time.monotonic()
    judge.read_control()
    judge.publish(0, record(0, hb[0], entered[0], time.monotonic() - since[0]))
    judge.move_control(Control.IDLE, Control.SUSPECT)
    judge.store.compare_set(keys.judge, "", "0")
    read_start = time.monotonic()
    records = judge.read_all(world)
    read = time.monotonic() - read_start
    decide_start = time.monotonic()
    verdict = decide(records, world, dead=set(), grace=GRACE, hang_after=300.0)
    decided = time.monotonic()
    stop.set()
    thread.join(timeout=30)
    if verdict is None:
        print("guard_scale.py: no verdict from the simulated records", file=sys.stderr)
        return 1
    beats = counts.get("get", 0) / world  # every rank's tick reads the control key once
    per_beat = steady_ops / world / beats
    print(f"guard_scale.py: {world} simulated ranks, one TCPStore, heartbeat {HEARTBEAT} s, grace {GRACE} s, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"steady state: {per_beat:.2f} store operations per rank per heartbeat, "
          f"{per_beat / HEARTBEAT:.2f} per rank per second at the {HEARTBEAT} s heartbeat "
          f"({steady_ops} in {beats:.0f} heartbeats of all ranks: "
          f"{', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}); the store serves "
          f"{per_beat / HEARTBEAT * world:,.0f} per second for the job")
    slowest = max(periods) if periods else float("nan")
    print(f"(the simulation sends every rank's heartbeat through one client, one round trip after another: "
          f"{slowest:.2f} s for all {world}; real ranks send theirs in parallel)")
    print(f"divergence -> verdict: {decided - since[0]:.2f} s ({verdict.decision.value}; grace {GRACE} s, "
          f"the judge's tick {decided - tick:.2f} s: reading {len(records)} records {read:.2f} s, deciding "
          f"{decided - decide_start:.3f} s; {sum(judge_store.ops.values())} store operations)")
    print(f"the verdict: {verdict.headline[:300]}")
    server_alive = server  # the server lives until here
    del server_alive
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
