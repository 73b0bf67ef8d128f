"""The guard inside one process: the hot path's recorder (calls.py) with what the rest of the guard asks
of it: group discovery (lifecycle.py), what this rank is held up by (for its monitor), its own findings,
and its files at exit."""

from __future__ import annotations

import os
import time

from ...findings import Finding
from ..config import GuardConfig
from ..fingerprint import CollectiveFingerprint, seqs_by_group
from . import cleanup, lifecycle
from .calls import CallRecorder
from .groups import sequence_numbers
from .rank_findings import RankFindings


class GuardRuntime(CallRecorder):
    def __init__(self, config: GuardConfig) -> None:
        super().__init__(config)
        self.started = time.time()
        self.world_size: int | None = None
        self.run_dir = config.run_dir
        self.own_run_dir = False  # made by this process (install() on its own): removed at exit
        self.findings = RankFindings(config)
        self.exited = False
        self.left_group = False  # destroy_process_group() ran; a new init_process_group starts over
        self.fatal: BaseException | None = None  # the uncaught exception this rank is dying of
        self.job: str | None = None  # the report folder of this group's job (rank/job_folder.py)
        self.generation = 0  # default groups this process has had before the current one (store keys)
        self.pid = os.getpid()  # a forked child (DataLoader worker) inherits this object but is not the rank
        # monotonic time at which the monitor last found this process running again after a stop
        self.resumed = 0.0
        # whether the program catches the error of the collective failing now (rank/catching.py)
        self.caught = False

    def identity(self) -> tuple[int, int, str]:
        """(rank, world size, run directory): set when the default group became ready, before the monitor,
        the records and the exit files that ask for them exist."""
        assert self.rank is not None and self.world_size is not None and self.run_dir is not None
        return self.rank, self.world_size, self.run_dir

    def group_ready(self) -> None:
        lifecycle.group_ready(self)

    def group_destroyed(self) -> None:
        lifecycle.group_destroyed(self)

    def record_finding(self, finding: Finding) -> None:
        """Keep a finding of this rank and leave it where the launcher collects findings."""
        self.findings.add(finding, self.run_dir, self.rank)

    def remove_files(self) -> None:
        cleanup.remove_files(self)

    # ---- what the monitor thread reads ----------------------------------------------------------------
    def waiting(self) -> tuple[CollectiveFingerprint, float] | None:
        """The collective this rank is held up by, and since when (monotonic): the call its main thread is
        in, else another thread's, else the oldest async collective whose Work has not completed.

        A wait that spans a stop of this process (Ctrl-Z, SIGSTOP, a suspended machine) counts from the
        resumption: the monotonic clock runs on while nothing runs, and a peer that is legitimately
        elsewhere would otherwise be judged hung the moment the job is continued."""
        held = self._held()
        if held is None:
            return None
        return held[0], max(held[1], self.resumed)

    def _held(self) -> tuple[CollectiveFingerprint, float] | None:
        current = self.current
        if current is not None:
            return current, self.entered
        try:
            side = list(self.side.items())
        except RuntimeError:  # added to while copied
            return None
        if side:
            return min(side, key=lambda item: item[1])
        return self.async_work.oldest_open()

    def sequence_numbers(self) -> dict[str, int]:
        """Each known group's sequence number now, C++-issued collectives included."""
        return sequence_numbers(self.groups.values())

    def recent(self) -> list[CollectiveFingerprint]:
        """The last `ring_size` calls issued from Python in this group, oldest first."""
        return self.ring.recent()

    def python_history(self) -> tuple[dict[str, list[int]], bool]:
        """Per group, the sequence numbers of the collectives this rank issued from Python that the ring
        still holds, and whether the ring holds everything since the group began (nothing dropped). With
        them a peer can tell "I made call #k" from "#k was a C++ collective" beyond its last few records."""
        complete = self.ring.complete()  # read first: calls made meanwhile only make it false
        return seqs_by_group((fp.signature.group, fp.seq) for fp in self.ring.recent()), complete
