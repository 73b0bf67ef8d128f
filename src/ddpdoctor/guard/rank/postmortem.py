"""A collective raised in the caller's thread (a peer died, gloo aborted a size mismatch): decide at once,
before the exception unwinds and the process dies, from every rank's record (or, with the store gone with
the peer that hosted it, from the files the ranks of this host left)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ...failsafe import failsafe
from ...records import RankRecord, RankState
from ..judge.records import (
    failed_alike,
    merge_flight_files,
    records_from_run_dir,
    refresh_from_flight,
    short_error,
)
from ..judge.verdict import Verdict, decide
from ..protocol import Control, Mark, RunDir
from .own_record import write_exit_record
from .publish import publish_report, stop_process
from .stop_policy import handling_of


class PostMortem:
    def __init__(self, monitor: Any) -> None:
        self.monitor = monitor

    def run(self, fp: Any, exc: BaseException) -> None:
        """Decide now from the records, or return for the error to be re-raised."""
        monitor = self.monitor
        with monitor._lock:
            monitor._stopping.set()
            error = short_error(exc)
            try:  # first, on disk: the launcher may stop this process before any verdict (see RankDeaths)
                write_exit_record(monitor.runtime, exc)
            except OSError:
                pass
            monitor.state = RankState.RUNNING
            monitor.runtime.current = fp
            through_store = False
            with failsafe("monitor.post_mortem: the store may be gone with the peer that hosted it"):
                self._through_store(error)
                through_store = True
            if not through_store:
                self._from_files(error)
            monitor.runtime.current = None
            # Nothing decided: the error is re-raised. The monitor stays stopped, so that this rank's
            # record keeps the error while the process dies of it; if the program catches it and issues
            # another collective, the runtime resumes the monitor (`resume`).
            monitor.runtime.paused = self.monitor
            monitor.runtime.hold_fast_path()  # `before` resumes the monitor at the next call

    def _through_store(self, error: str) -> None:
        """Publish this rank's failure and decide from every rank's record, for up to 3 s: a verdict is
        announced (and this process stops); returns if there is none."""
        monitor = self.monitor
        assert monitor.link is not None
        own = replace(
            monitor.record(with_stack=True, error=error), waited=time.monotonic() - monitor.runtime.entered
        )
        monitor.link.publish(monitor.rank, own)
        if not handling_of(monitor.runtime).stops:
            # the program expects this error: one look, reported, and the error goes to it without delay
            records, dead = self._records_after_a_failure(own)
            verdict = decide(records, monitor.world_size, dead=dead, grace=0.0, hang_after=float("inf"))
            # not "the peer runs elsewhere" (it may be failing this very moment), nor an error every rank got
            if (verdict is not None and not verdict.decision.weak
                    and not failed_alike({**records, monitor.rank: own}, monitor.world_size)):
                monitor.announce(verdict, records)
            return
        deadline = time.monotonic() + 3.0
        weak: tuple[Verdict, dict[int, RankRecord]] | None = None
        while True:
            control = monitor.link.read_control()
            if control.state is Control.VERDICT:
                monitor.obey(control)
            records, dead = self._records_after_a_failure(own)
            verdict = decide(records, monitor.world_size, dead=dead, grace=0.0, hang_after=float("inf"))
            if verdict is not None and verdict.decision.weak:
                # "the peer is running elsewhere" right after the connection to it broke: it may be dying
                # this very moment (a SIGKILLed process closes its sockets before it is a zombie). Give its
                # death until the deadline to show.
                weak = (verdict, records)
            elif verdict is not None:
                monitor.announce(verdict, records)
            elif failed_alike({**records, monitor.rank: own}, monitor.world_size):
                # every peer failed in this same call with this same error: an argument every backend
                # refuses (float8 for gloo), not a rank that is missing
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if weak is not None:
            monitor.announce(*weak)

    def _records_after_a_failure(self, own: RankRecord) -> tuple[dict[int, RankRecord], set[int]]:
        """Every rank's record, this one's failure in it, dead peers' and stale live peers' brought up to
        what their flight files show; and the dead."""
        monitor = self.monitor
        assert monitor.link is not None
        records = monitor.link.read_all(monitor.world_size)
        records[monitor.rank] = own
        dead = monitor.liveness.dead(records)
        records = merge_flight_files(monitor.liveness.with_exit_statuses(records, dead), dead, monitor.host)
        return refresh_from_flight(records, monitor.host, skip=dead | {monitor.rank}), dead

    def _from_files(self, error: str) -> None:
        """The store is gone: decide from the files the ranks of this host left in the run directory."""
        monitor = self.monitor
        records = records_from_run_dir(monitor.runtime.run_dir, monitor.world_size)
        records[monitor.rank] = replace(monitor.record(with_stack=True, error=error), waited=0.0)
        dead = {r for r, rec in records.items() if rec.state is RankState.DEAD}
        verdict = decide(records, monitor.world_size, dead=dead, grace=0.0, hang_after=float("inf"))
        files = RunDir(monitor.runtime.run_dir)
        handling = handling_of(monitor.runtime)
        if verdict is not None and not handling.stops:
            monitor.reported.report(verdict, monitor.runtime, handling)
        elif verdict is not None and not files.has(Mark.REPORTED) and not files.has(Mark.STOPPING):
            publish_report(verdict, monitor.runtime, records)
            stop_process(monitor.runtime, 1)

