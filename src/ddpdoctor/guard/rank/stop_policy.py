"""Whether the guard stops the job on a failure it found, or reports it and leaves the program's own handling
to go on: a program that expects torch's error (in `monitored_barrier`, which is a diagnosis with its own
timeout and error, or in a `try` or `assertRaises` around the collective) must get that error, as it would
without the guard. `ddpdoctor run --stop-always` stops on every verdict."""

from __future__ import annotations

import dataclasses
import enum
import sys
from typing import TYPE_CHECKING, Any

from ...findings import Finding, Severity

if TYPE_CHECKING:
    from ..judge.verdict import Verdict
    from .runtime import GuardRuntime


class Handling(enum.Enum):
    """Who acts on a verdict: the guard (stops the job), or the program (the guard only reports)."""

    STOP = "stop"
    MONITORED_BARRIER = "monitored-barrier"  # the waiting rank is in monitored_barrier (its own error)
    CAUGHT = "caught"  # the program catches the error the failing collective raises

    @property
    def stops(self) -> bool:
        return self is Handling.STOP

    @property
    def words(self) -> str:
        return {
            Handling.STOP: "the guard stopped the job",
            Handling.MONITORED_BARRIER: "not stopped: monitored_barrier raises its own error for the program",
            Handling.CAUGHT: "not stopped: the program catches this collective's error",
        }[self]


def handling_of(runtime: GuardRuntime) -> Handling:
    """Decided on the waiting rank (the judge, or the rank whose collective raised): its call, and what its
    failing collective's caller said (`runtime.caught`, set in `CallRecorder.failed`)."""
    if runtime.config.stop_always:
        return Handling.STOP
    current = runtime.current
    if current is not None and current.signature.op == "monitored_barrier":
        return Handling.MONITORED_BARRIER
    if runtime.caught:
        return Handling.CAUGHT
    return Handling.STOP


def reported_finding(verdict: Verdict, handling: Handling) -> Finding:
    """The verdict as a warning that says it did not stop the job (the job's exit code stays its own)."""
    finding = verdict.finding()
    return dataclasses.replace(
        finding,
        severity=Severity.WARNING,
        message=f"{finding.message} ({handling.words})",
        facts={**finding.facts, "handling": handling.value},
    )


class ReportOnly:
    """Reports each verdict once per collective (not again at each heartbeat with a longer wait), in this
    rank's findings (report.json) and one stderr line."""

    def __init__(self) -> None:
        self.said: set[tuple[Any, ...]] = set()

    def report(self, verdict: Verdict, runtime: GuardRuntime, handling: Handling) -> None:
        key = (verdict.decision, verdict.group, verdict.seq)
        if key in self.said:
            return
        self.said.add(key)
        finding = reported_finding(verdict, handling)
        runtime.record_finding(finding)
        try:
            print(f"[ddpdoctor] rank {runtime.rank}: {finding.class_}: {finding.message}", file=sys.stderr,
                  flush=True)
        except (OSError, ValueError):  # stderr closed
            pass
