"""Which peers are alive, as one rank's monitor sees them: from their heartbeat counts, and on this host from
their processes. The clock is injected, so that a test can move time instead of waiting for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from ...records import RankRecord, RankState
from ..host import pid_alive, process_stopped, zombie_status


class Liveness:
    def __init__(self, rank: int, world_size: int, host: str, *, heartbeat: float, dead_after: float,
                 resumed: Callable[[], float], clock: Callable[[], float] = time.monotonic) -> None:
        """`resumed`: when this process last ran again after a stop (monotonic), see `silent_for`."""
        self.rank = rank
        self.world_size = world_size
        self.host = host
        self.heartbeat = heartbeat
        self.dead_after = dead_after
        self.resumed = resumed
        self.clock = clock
        self.seen: dict[int, tuple[int, float]] = {}  # rank -> (heartbeat count, when it was first seen)

    def silent_for(self, rank: int, hb: int) -> float:
        """Seconds since this monitor saw `rank`'s heartbeat count change (0 the first time it looks), not
        counting the time before this process last resumed from a stop (the peer was likely stopped too)."""
        now = self.clock()
        seen = self.seen.get(rank)
        if seen is None or seen[0] != hb:
            self.seen[rank] = (hb, now)
            return 0.0
        return now - max(seen[1], self.resumed())

    def dead(self, records: Mapping[int, RankRecord]) -> set[int]:
        """The peers that are gone: on this host, whose process is; elsewhere, silent for `dead_after`."""
        dead = set()
        for rank in range(self.world_size):
            record = records.get(rank)
            if record is None or rank == self.rank:
                continue
            silent = self.silent_for(rank, record.hb)
            if record.state is RankState.EXITED:
                continue
            if record.host == self.host and record.pid:
                # On the same host the process itself is the evidence: a rank whose monitor went quiet
                # (it failed open, or a C extension holds the GIL) but whose process runs is not dead.
                if not pid_alive(record.pid):
                    dead.add(rank)
            elif silent > self.dead_after:
                dead.add(rank)
        return dead

    def with_exit_statuses(self, records: Mapping[int, RankRecord], dead: set[int]) -> dict[int, RankRecord]:
        """The wait status of each dead rank of this host, readable until its parent reaps it."""
        out = dict(records)
        for rank in dead:
            record = records.get(rank)
            if record is not None and record.host == self.host and record.pid:
                status = zombie_status(record.pid)
                if status is not None:
                    out[rank] = replace(record, exit_status=status)
        return out

    def with_silences(self, records: Mapping[int, RankRecord], dead: set[int]) -> dict[int, RankRecord]:
        """A peer whose heartbeat stopped but is not dead (yet): say so, its record is stale."""
        out = dict(records)
        for rank, record in records.items():
            if rank == self.rank or rank in dead or rank not in self.seen:
                continue
            silent = self.silent_for(rank, record.hb)
            # On this host a stopped process is seen at once (its state in /proc), before its silence is
            # long enough to tell from a heartbeat that a busy machine runs late; a peer heard from within
            # the last heartbeat is not asked about.
            stopped = (silent > self.heartbeat and record.host == self.host and bool(record.pid)
                       and process_stopped(int(record.pid or 0)))
            if stopped or silent > 3 * self.heartbeat + 1.0:
                out[rank] = replace(record, silent=round(silent, 1), process_stopped=stopped)
        return out
