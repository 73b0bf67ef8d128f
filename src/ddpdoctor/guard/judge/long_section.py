"""F13 single-rank-long-section: one rank running alone while its peers wait in a collective. Pure.

A peer outside the collective whose main thread moves (rank/progress.py) is slow, not stuck: `--hang-after`
does not apply to it. Past `--slow-after` the waiting rank's monitor notes it once (`long_section`), and
the note stays in the report as a warning with the durations; if the process group's timeout ends the wait
first, the failed collective is judged by `alone_in_failed_wait` (an error of this class, not a
`collective-timeout`: the fix is where the lone work runs, not the other ranks).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ...advice import advice, class_references
from ...findings import Evidence, Finding, Fix, Location, Severity
from ...records import CallRecord, Frame, RankRecord, RankState
from ...render.paths import short_path
from ..fingerprint import P2P_OPS, describe
from .places import where

SLUG = "single-rank-long-section"


def running(record: RankRecord | None, hang_after: float) -> bool:
    """A rank outside every collective whose main thread moved within `hang_after` (a silence counts as
    stillness: a monitor that cannot publish cannot say it moves)."""
    if record is None or record.state is not RankState.RUNNING or record.current is not None:
        return False
    if record.process_stopped or record.still_for is None:
        return False
    return record.still_for + (record.silent or 0.0) < hang_after


# How much longer than --hang-after a peer whose progress is not known yet may keep its peers waiting before
# it is judged as a stuck one: its monitor samples it every heartbeat, so only a monitor starved of the CPU
# (a machine with many more runnable threads than cores: seen 1.7 s between two samples at a load of 10 on
# 2 cores) takes that long; one that never samples again goes silent, which liveness judges.
UNKNOWN_PROGRESS_WAIT_S = 10.0


def progress_unknown(record: RankRecord | None, waited: float, hang_after: float) -> bool:
    """A rank outside every collective whose main thread has not been sampled twice yet (slow or stuck is
    not known), for at most `hang_after` again (10 s at least) after --hang-after."""
    if record is None or record.state is not RankState.RUNNING or record.current is not None:
        return False
    if record.process_stopped or not record.progress_unknown:
        return False
    return waited < hang_after + max(hang_after, UNKNOWN_PROGRESS_WAIT_S)


def lone_frame(record: RankRecord) -> Frame | None:
    """The innermost frame the user wrote, else the innermost one: where the lone rank is."""
    return next((f for f in record.stack if f.library is None), record.stack[0] if record.stack else None)


def frame_words(frame: Frame | None) -> str:
    if frame is None:
        return "an unknown place (no stack published)"
    function = f"in {frame.function}() at " if frame.function != "<module>" else "at "
    return f"{function}{short_path(frame.path)}:{frame.line}"


@dataclass(frozen=True)
class LongSection:
    """Ranks waiting in `call` for `waited` seconds while `alone` run on, each at its frame."""

    call: CallRecord
    waiting: tuple[int, ...]
    alone: Mapping[int, Frame | None]
    waited: float
    ended: bool = False  # the wait is over: `waited` is the whole section

    @property
    def key(self) -> tuple[str, int]:
        return self.call.group, self.call.seq

    @property
    def message(self) -> str:
        lone = " and ".join(f"rank {r}" for r in sorted(self.alone))
        places = "; ".join(frame_words(f) for _, f in sorted(self.alone.items()))
        plural = len(self.waiting) > 1
        ranks = ("ranks " if plural else "rank ") + ", ".join(map(str, self.waiting))
        if self.ended:
            return (
                f"{lone} ran alone for {self.waited:.0f} s, {places}, while {ranks} waited in "
                f"{self._waited_in}: slow, not stuck (its stack moved), so the guard let it run; a "
                f"process-group timeout shorter than that ends the job there"
            )
        return (
            f"{lone} has run alone for {self.waited:.0f} s so far, {places}, while {ranks} "
            f"wait{'' if plural else 's'} in {self._waited_in}: slow, not stuck (its stack moves), so "
            f"the guard lets it run; the process group's timeout will not"
        )

    @property
    def _waited_in(self) -> str:
        return (f"{describe(self.call)} at {where(self.call)} (collective #{self.call.seq} of group "
                f"{self.call.group})")

    def finding(self) -> Finding:
        locations = [Location(f.path, f.line, rank=r) for r, f in sorted(self.alone.items()) if f]
        site = self.call.site or self.call.library
        if site is not None:
            locations += [Location(site.path, site.line, rank=r) for r in self.waiting]
        facts: dict[str, Any] = {
            "kind": "alone", "alone": sorted(self.alone), "waiting": list(self.waiting),
            "group": self.call.group, "seq": self.call.seq, "waited_s": round(self.waited, 1),
            "ended": self.ended,
            "lines": {str(r): frame_words(f) for r, f in sorted(self.alone.items())},
        }
        return Finding(
            class_=SLUG, message=self.message, severity=Severity.WARNING, locations=tuple(locations),
            fix=Fix(advice(SLUG)),
            evidence=tuple(Evidence(f"rank {r}: running {frame_words(f)}", rank=r)
                           for r, f in sorted(self.alone.items())),
            references=class_references(SLUG), facts=facts,
        )


def long_section(records: Mapping[int, RankRecord], world_size: int, *, dead: Collection[int],
                 slow_after: float, hang_after: float) -> LongSection | None:
    """The longest wait past `slow_after` whose peers outside the call all run; None if there is none."""
    waiters = sorted(
        (r for r, rec in records.items() if rec.current is not None and not rec.current.failed
         and rec.current.op not in P2P_OPS and r not in dead and (rec.waited or 0.0) >= slow_after),
        key=lambda r: (-(records[r].waited or 0.0), r),
    )
    for rank in waiters:
        call = records[rank].current
        assert call is not None
        members = records[rank].groups.get(call.group)
        others = [r for r in range(world_size) if r != rank and (members is None or r in members)]
        outside = [r for r in others if not _in_call(records.get(r), call)]
        if outside and all(running(records.get(r), hang_after) for r in outside):
            waiting = tuple(sorted([rank] + [r for r in others if r not in outside]))
            alone = {r: lone_frame(records[r]) for r in outside}
            return LongSection(call, waiting, alone, records[rank].waited or 0.0)
    return None


def alone_peers(records: Mapping[int, RankRecord], call: CallRecord, absent: Collection[int],
                hang_after: float) -> bool:
    """Whether every peer outside `call` is running (slow, not stuck)."""
    return bool(absent) and all(
        running(records.get(r), hang_after) and not _in_call(records.get(r), call) for r in absent
    )


def alone_headline(rank: int, call: CallRecord, waited: float, failed: bool,
                   records: Mapping[int, RankRecord], absent: Collection[int]) -> str:
    """The headline of a wait on ranks that are running alone."""
    lone = "; ".join(f"rank {r} is running alone {frame_words(lone_frame(records[r]))}"
                     for r in sorted(absent))
    how = "failed" if failed else f"has waited {waited:.0f} s"
    end = "; the process group's timeout ended a long one-rank section (slow, not stuck)" if failed else ""
    return (f"rank {rank} {how} in {describe(call)} at {where(call)} (collective #{call.seq} of group "
            f"{call.group}) while {lone}{end}")


def _in_call(record: RankRecord | None, call: CallRecord) -> bool:
    current = record.current if record is not None else None
    return current is not None and current.group == call.group and current.seq == call.seq
