"""One row of the report per rank: its `RankStatus`, derived from its record, and the words for it.

The status is what code looks at (the monitor counts the ranks that are gone by it); the text is made
from it for the reader and never read back.
"""

from __future__ import annotations

import signal
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from ...records import CallRecord, CallState, Frame, MetricOrigin, RankRecord, RankState, RankStatus
from ...render.paths import short_path
from ..fingerprint import describe
from .places import in_backward, in_compiled_graph, location_of, user_line, where

# What a rank's fatal signal usually means, for the report's one line.
_SIGNAL_GLOSS = {
    "SIGKILL": "what the kernel's OOM killer sends, and schedulers enforcing a memory or time limit",
    "SIGABRT": "a native abort: gloo on a size mismatch, a failed check in torch, NCCL or CUDA",
    "SIGSEGV": "a crash in native code (an extension, a driver, CUDA)",
    "SIGBUS": "often a full /dev/shm (DataLoader workers' shared memory)",
}


@dataclass(frozen=True)
class RankRow:
    status: RankStatus
    state: str  # the status in words, with what and where
    where: str | None = None
    stack: tuple[Frame, ...] = ()
    call: CallRecord | None = None  # the call it is in, or the last it completed
    metric: MetricOrigin | None = None
    location: tuple[str, int] | None = None

    def facts(self) -> dict[str, Any]:
        """The row in a finding's `facts["ranks"]` (docs/guard.md)."""
        return {
            "state": self.state,
            "where": self.where,
            "fingerprint": self.call.to_json() if self.call else None,
            "metric": self.metric.to_dict() if self.metric else None,
            "stack": [frame.to_list() for frame in self.stack],
        }


def fatal_signal(record: RankRecord) -> str | None:
    """The name of the signal a dead rank was killed by ("SIGKILL"), from its wait status or fault log."""
    status = record.exit_status
    if status is None:
        return record.signal or None
    if status & 0x7F == 0:
        return None  # it exited with a code
    try:
        return signal.Signals(status & 0x7F).name
    except ValueError:
        return f"signal {status & 0x7F}"


def how_it_ended(record: RankRecord, gloss: bool = True) -> str | None:
    """"killed by SIGKILL" (with `gloss`: ": what the kernel's OOM killer sends, ...") or "exit code 1",
    from the wait status the launcher or a same-host peer read while the dead process was a zombie, or
    the signal the rank's fault log names; None if neither knows."""
    if record.exit_status is not None and record.exit_status & 0x7F == 0:
        return f"exit code {(record.exit_status >> 8) & 0xFF}"
    name = fatal_signal(record)
    if name is None:
        return None
    meaning = _SIGNAL_GLOSS.get(name) if gloss else None
    return f"killed by {name}" + (f": {meaning}" if meaning else "")


def died_at(record: RankRecord) -> str:
    """" at train.py:12 in load_batch": the user's line a crashed rank's fault log shows it died on."""
    line = user_line(record.stack) if record.died_here else None
    return f" at {line}" if line else ""


def died_of_a_failed_collective(record: RankRecord | None) -> bool:
    return record is not None and record.current is not None and record.current.failed


def rank_row(record: RankRecord | None, rank: int, dead: Collection[int]) -> RankRow:
    """One row of the report for a rank: its status, in words, where, stack."""
    if record is None:
        return RankRow(
            RankStatus.NO_RECORD, "no record (never reached the guard, or died before its first heartbeat)"
        )
    if rank in dead or record.state is RankState.DEAD:
        return _dead_row(record)
    if record.state is RankState.EXITED:
        return _exited_row(record)
    if record.state is RankState.STOPPED:
        return _stopped_row(record)
    if record.current is not None:
        return _in_collective_row(record, record.current)
    if record.silent:
        return _silent_row(record)
    return _running_row(record)


def _stack(record: RankRecord) -> tuple[Frame, ...]:
    """Its published stack; one decided before it published it shows the frames its call recorded,
    innermost first."""
    current = record.current
    if record.stack or current is None:
        return record.stack
    return tuple(frame for frame in (current.library, current.site) if frame)


def _dead_row(record: RankRecord) -> RankRow:
    current, last = record.current, record.last
    how = how_it_ended(record, gloss=False)  # the headline has the gloss; the row stays short
    parts = [how + died_at(record)] if how else []
    if last:
        parts.append(
            f"{'in' if current else 'after'} {describe(last)}, #{last.seq} of group {last.group}, at "
            f"{where(last, record.metric)}"
        )
    state = "dead" + (f" ({'; '.join(parts)})" if parts else "")
    if record.error:  # its exit record: an exception raised outside a guarded call
        state += f": {record.error}"
    stack = _stack(record)
    # a rank that crashed outside a collective is placed where it crashed, not at its last collective
    placed = None if record.died_here and not current else last
    return RankRow(
        RankStatus.DEAD,
        state,
        where(last, record.metric) if last else None,
        stack,
        last,
        record.metric,
        location_of(placed, record.metric, stack),
    )


def _last_collective(last: CallRecord | None) -> str:
    return f"; its last collective was {describe(last)} at {where(last, None)}" if last else ""


def _exited_row(record: RankRecord) -> RankRow:
    last = record.recent[-1] if record.recent else None
    state = "exited (finished its script / destroyed its process group)" + _last_collective(last)
    stack = _stack(record)
    return RankRow(
        RankStatus.EXITED,
        state,
        where(last, None) if last else None,
        stack,
        record.last,
        record.metric,
        location_of(last, None, stack),
    )


def _stopped_row(record: RankRecord) -> RankRow:
    """A rank the launcher stopped (no error of its own) because another one died first: `ddpdoctor run`
    saw the order."""
    current = record.current
    stack = _stack(record)
    if current is not None:
        verb = "failed in" if current.failed else "in"
        error = f": {record.error}" if record.error else ""
        state = (
            f"{verb} {describe(current)} (collective #{current.seq} of group {current.group}){error}; then "
            "stopped by the launcher"
        )
        return RankRow(
            RankStatus.STOPPED,
            state,
            where(current, record.metric),
            stack,
            current,
            record.metric,
            location_of(current, record.metric, record.stack),
        )
    last = record.last
    state = "stopped by the launcher outside a collective" + _last_collective(last)
    return RankRow(RankStatus.STOPPED, state, where(last, None) if last else None, stack, last, record.metric,
                   location_of(last, None, record.stack))


def _in_collective_row(record: RankRecord, current: CallRecord) -> RankRow:
    failed = current.state is CallState.FAILED
    state = (
        f"{'failed in' if failed else 'in'} {describe(current)} "
        f"(collective #{current.seq} of group {current.group})"
    )
    # not "waiting 0.0 s": it just entered
    if record.waited is not None and not failed and record.waited >= 0.05:
        state += f", waiting {record.waited:.1f} s"
    if record.error:
        state += f": {record.error}"
    stack = _stack(record)
    return RankRow(RankStatus.FAILED_IN_COLLECTIVE if failed else RankStatus.IN_COLLECTIVE, state,
                   where(current, record.metric), stack, current, record.metric,
                   location_of(current, record.metric, stack))


def _silent_row(record: RankRecord) -> RankRow:
    """Its record is heartbeats old: what it says it does is stale (a stopped or stuck process)."""
    state = (f"not responding (no heartbeat for {record.silent:.0f} s"
             + ("; its process is stopped, SIGSTOP or a debugger" if record.process_stopped else "")
             + "); last seen running, not in a collective")
    return RankRow(RankStatus.NOT_RESPONDING, state, None, record.stack, record.last, record.metric,
                   location_of(None, None, record.stack))


def _running_row(record: RankRecord) -> RankRow:
    stack = record.stack
    status, state = RankStatus.RUNNING, "running, not in a collective"
    if in_backward(stack):  # where DDP's gradient all_reduce runs, issued from C++
        status, state = RankStatus.IN_BACKWARD, "in backward, not in a Python collective"
    if in_compiled_graph(stack):  # it may be in one: a compiled graph's are not seen
        status = RankStatus.IN_COMPILED_GRAPH
        state = "running a compiled graph (torch.compile: its collectives are not seen one by one)"
    place = None
    if stack:
        top = next((f for f in stack if f.library is None), stack[0])
        state += f" (at {short_path(top.path)}:{top.line} in {top.function})"
        place = f"{short_path(top.path)}:{top.line}"
    return RankRow(status, state, place, stack, record.last, record.metric, location_of(None, None, stack))
