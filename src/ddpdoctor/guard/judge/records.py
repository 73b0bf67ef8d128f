"""A rank's record as the judge reads it, where it comes from files rather than the store: a dead
rank's flight file, the meta and exit files a run directory holds (the store may have died with the rank
that hosted it), and the exit record a rank leaves as it dies."""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping
from dataclasses import replace

from ...records import CallRecord, CallState, ExitRecord, Frame, RankMeta, RankRecord, RankState
from ..fingerprint import seqs_by_group
from ..host import pid_alive, this_host
from ..protocol import RunDir, read_json
from .fault_logs import read_fault_log
from .flight_files import read_flight

RECENT = 16  # completed calls a record carries


def failed_alike(records: Mapping[int, RankRecord], world_size: int) -> bool:
    """Whether every rank's record shows it failed in the same collective with the same error: an
    argument the backend refuses on every rank (float8 for gloo, inconsistent all_to_all splits), whose
    traceback says it all, not one rank failing the others (a timeout here and "connection closed"
    there differ)."""
    first = records.get(0)
    if first is None or first.current is None or first.error is None:
        return False
    if "timed out" in first.error.lower():  # every rank timing out is a hang, to be reported
        return False
    position = first.current.position
    return all(_failed_in(records.get(r), position, first.error) for r in range(world_size))


def _failed_in(record: RankRecord | None, position: tuple[str, int], error: str) -> bool:
    current = record.current if record is not None else None
    return (record is not None and current is not None and current.failed and current.position == position
            and record.error == error)


def short_error(exc: BaseException) -> str:
    """`Connection closed by peer` rather than gloo's whole enforce text; `sys.exit(3)` for a rank that
    gave up with a status."""
    if isinstance(exc, SystemExit):
        return f"sys.exit({exc.code!r})"
    text = (str(exc).splitlines() or [""])[0]
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    text = text.split(". This is typically", 1)[0]
    return f"{type(exc).__name__}: {text[:200]}"


def merge_flight_files(
    records: Mapping[int, RankRecord], dead: Collection[int], host: str
) -> dict[int, RankRecord]:
    """The records, where a dead rank of this host left a flight file: what it says that rank was doing
    when it died, and the signal and stack of its fault log if it crashed."""
    out = dict(records)
    for rank in dead:
        record = records.get(rank)
        flight = record.flight if record is not None and record.host == host else None
        if record is None or not flight:
            continue
        record = replace(with_flight(record, read_flight(flight)), state=RankState.DEAD)
        out[rank] = with_fault_log(record, RunDir(os.path.dirname(flight)).fault_log(rank))
    return out


def with_fault_log(record: RankRecord, path: str) -> RankRecord:
    """A crashed rank's signal, and the stack it died with in place of its last published one (a
    heartbeat old); a rank that died of a Python error keeps the stack where the error was raised."""
    fatal = read_fault_log(path)
    if fatal is None:
        return record
    if fatal.stack and not record.error:
        return replace(record, signal=fatal.name, stack=tuple(fatal.stack), died_here=True)
    return replace(record, signal=fatal.name)


def refresh_from_flight(
    records: Mapping[int, RankRecord], host: str, skip: Collection[int]
) -> dict[int, RankRecord]:
    """For live ranks on this host: the call their flight file shows them in, where their last published
    record does not know it yet. A record is up to a heartbeat old, and a post-mortem decides within
    milliseconds of a peer's death, when the others have just entered the collective it broke; the
    flight file is written as each call enters. Only a record that says its rank is in no collective is
    brought up to date: one that says its call failed (its own post-mortem's) stands, as the rank may have
    caught the error and gone on, and the failure is what the judge must compare. A call the flight file
    shows failed (the same broken collective, on a rank that had not yet published its own post-mortem)
    is brought in with the error of the rank's exit record, if it has written one."""
    now = time.time()
    out = dict(records)
    for rank, record in records.items():
        if (rank in skip or record.host != host or not record.flight or record.state is not RankState.RUNNING
                or record.current is not None or record.error):
            continue
        calls = read_flight(record.flight)
        if not calls or calls[-1].state is CallState.DONE:
            continue
        last = calls[-1]
        if last.index <= max((call.index for call in record.recent or ()), default=0):
            continue
        # its stack was taken before it made this call
        if last.state is CallState.IN:
            out[rank] = replace(record, current=last, stack=(), waited=max(0.0, now - (last.time or now)))
            continue
        exit_record = read_exit_record(RunDir(os.path.dirname(record.flight)).exit_record(rank))
        out[rank] = replace(
            record,
            current=last,
            stack=(),
            waited=0.0,
            error=exit_record.error or record.error,
            gave_up=exit_record.gave_up or record.gave_up,
        )
    return out


def read_exit_record(path: str) -> ExitRecord:
    found = read_json(path)
    return ExitRecord.from_json(found) if isinstance(found, dict) else ExitRecord()


def with_flight(record: RankRecord, calls: list[CallRecord]) -> RankRecord:
    """A record brought up to what its rank's flight file shows: its Python history, and the call it is in."""
    if not calls:
        return record
    python_seqs = {group: tuple(seqs) for group, seqs in seqs_by_group(c.position for c in calls).items()}
    complete = calls[0].index == 1  # the file still holds the first call
    record = replace(record, python_seqs=python_seqs, history_complete=complete)
    last = calls[-1]
    if last.state is not CallState.DONE:
        return replace(
            record, current=last, waited=record.waited or 0.0, recent=tuple(calls[-RECENT - 1 : -1])
        )
    return replace(record, current=None, recent=tuple(calls[-RECENT:]))


def records_from_run_dir(run_dir: str, world_size: int | None = None) -> dict[int, RankRecord]:
    """Records rebuilt from the meta and flight files ranks left in a run directory (no store needed)."""
    records: dict[int, RankRecord] = {}
    files = RunDir(run_dir)
    for _, path in files.metas():
        meta = RankMeta.from_json(read_json(path))
        if meta is not None:
            records[meta.rank] = _record_from_files(files, meta)
    return records


def _record_from_files(files: RunDir, meta: RankMeta) -> RankRecord:
    rank = meta.rank
    alive = meta.host == this_host() and pid_alive(meta.pid)
    flight = files.flight(rank)
    # The flight file holds every Python-issued collective up to its size: an empty one is a history too.
    record = RankRecord(
        rank,
        pid=meta.pid,
        host=meta.host,
        state=RankState.RUNNING if alive else RankState.DEAD,
        flight=flight,
        recent=(),
    )
    record = with_flight(record, read_flight(flight))
    exit_record = read_exit_record(files.exit_record(rank))
    record = replace(
        record,
        error=exit_record.error if exit_record.error is not None else record.error,
        seqs=exit_record.seqs if exit_record.seqs is not None else record.seqs,
        stack=exit_record.stack if exit_record.stack is not None else record.stack,
        state=RankState.EXITED if exit_record.exited else record.state,
        gave_up=exit_record.gave_up or record.gave_up,
    )
    if record.state is RankState.DEAD:  # not a rank that finished and then aborted in torch's teardown
        record = with_fault_log(record, files.fault_log(rank))
    return record


def exception_stack(exc: BaseException) -> tuple[Frame, ...]:
    """The stack where an exception was raised, innermost first, as records carry stacks."""
    from ...callsite import stack_of

    traceback = exc.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    return tuple(stack_of(traceback.tb_frame)) if traceback is not None else ()
