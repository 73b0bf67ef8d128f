"""The judge's live note of a single-rank-long-section (judge/long_section.py decides it): one line on
stderr once per wait (and once more when a lone rank's line, unknown at first, becomes known), and a
warning among the rank's findings that the end of the wait completes with the whole duration. Never
stops the job."""

from __future__ import annotations

import sys
import time
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from ...records import RankRecord

if TYPE_CHECKING:
    from ..judge.long_section import LongSection
    from .runtime import GuardRuntime


class LongSectionNotes:
    def __init__(self, runtime: GuardRuntime) -> None:
        self.runtime = runtime
        self.open: LongSection | None = None  # the section noted and not yet over
        self._started = 0.0  # monotonic time the noted wait began

    def observe(self, records: Mapping[int, RankRecord], world_size: int, dead: Collection[int]) -> None:
        """On a judge's tick that found no verdict: note a lone rank past --slow-after, once per wait."""
        from ..judge.long_section import long_section  # imported with the judging (see monitor.py)

        config = self.runtime.config
        found = long_section(records, world_size, dead=dead, slow_after=config.note_slow_after,
                             hang_after=config.hang_after)
        if found is None:
            return
        if self.open is not None and self.open.key == found.key:
            self._place(self.open, found)
            return
        self.close()
        self.open = found
        self._started = time.monotonic() - found.waited
        finding = found.finding()
        self.runtime.record_finding(finding)
        self._say(finding.message)

    def _place(self, noted: LongSection, found: LongSection) -> None:
        """The noted wait again, now with the line of a lone rank whose stack was not published when it was
        noted (on a busy machine the peers' stacks come a heartbeat or two later): the warning names it."""
        unplaced = [rank for rank, frame in noted.alone.items() if frame is None]
        if not any(found.alone.get(rank) is not None for rank in unplaced):
            return
        placed = replace(noted, alone={rank: frame if frame is not None else found.alone.get(rank)
                                       for rank, frame in noted.alone.items()})
        self.runtime.findings.replace(noted.finding(), placed.finding(), self.runtime.run_dir,
                                      self.runtime.rank)
        self.open = placed
        self._say(replace(placed, waited=found.waited).finding().message)  # the line, said as soon as known

    def _say(self, message: str) -> None:
        try:
            print(f"[ddpdoctor] note (rank {self.runtime.rank}): {message}", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # stderr closed
            pass

    def close(self) -> None:
        """The noted wait is over: its warning now says how long it lasted."""
        noted, self.open = self.open, None
        if noted is None:
            return
        ended = replace(noted, waited=time.monotonic() - self._started, ended=True)
        self.runtime.findings.replace(noted.finding(), ended.finding(), self.runtime.run_dir,
                                      self.runtime.rank)
