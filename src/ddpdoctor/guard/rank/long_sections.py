"""The judge's live note of a single-rank-long-section (judge/long_section.py decides it): one line on
stderr once per wait, and a warning among the rank's findings that the end of the wait completes with the
whole duration. Never stops the job."""

from __future__ import annotations

import sys
import time
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from ...records import RankRecord
from ..judge.long_section import LongSection, long_section

if TYPE_CHECKING:
    from .runtime import GuardRuntime


class LongSectionNotes:
    def __init__(self, runtime: GuardRuntime) -> None:
        self.runtime = runtime
        self.open: LongSection | None = None  # the section noted and not yet over
        self._started = 0.0  # monotonic time the noted wait began

    def observe(self, records: Mapping[int, RankRecord], world_size: int, dead: Collection[int]) -> None:
        """On a judge's tick that found no verdict: note a lone rank past --slow-after, once per wait."""
        config = self.runtime.config
        found = long_section(records, world_size, dead=dead, slow_after=config.note_slow_after,
                             hang_after=config.hang_after)
        if found is None or (self.open is not None and self.open.key == found.key):
            return
        self.close()
        self.open = found
        self._started = time.monotonic() - found.waited
        finding = found.finding()
        self.runtime.record_finding(finding)
        try:
            print(f"[ddpdoctor] note (rank {self.runtime.rank}): {finding.message}", file=sys.stderr,
                  flush=True)
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
