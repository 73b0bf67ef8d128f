"""A rank's record as the judge reads it, where it comes from files rather than the store: a dead
rank's flight file, the meta and exit files a run directory holds (the store may have died with the rank
that hosted it), and the exit record a rank leaves as it dies."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .fault_log import fault_log_path, read_fault_log
from .fingerprint import seqs_by_group
from .flight import read_flight
from .host import pid_alive, this_host

RECENT = 16  # completed fingerprints a record carries


def failed_alike(records: dict[int, dict[str, Any]], world_size: int) -> bool:
    """Whether every rank's record shows it failed in the same collective with the same error: an
    argument the backend refuses on every rank (float8 for gloo, inconsistent all_to_all splits), whose
    traceback says it all, not one rank failing the others (a timeout here and "connection closed"
    there differ)."""
    first = records.get(0) or {}
    mine = first.get("current") or {}
    group, seq, error = mine.get("group"), mine.get("seq"), first.get("error")
    if error is None or "timed out" in str(error).lower():  # every rank timing out is a hang, to be reported
        return False
    return all(_failed_in(records.get(r), group, seq, error) for r in range(world_size))


def _failed_in(record: dict[str, Any] | None, group: Any, seq: Any, error: Any) -> bool:
    current = (record or {}).get("current") or {}
    return (current.get("state") == "failed" and current.get("group") == group and current.get("seq") == seq
            and (record or {}).get("error") == error)


def short_error(exc: BaseException) -> str:
    """`Connection closed by peer` rather than gloo's whole enforce text."""
    text = (str(exc).splitlines() or [""])[0]
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    text = text.split(". This is typically", 1)[0]
    return f"{type(exc).__name__}: {text[:200]}"


def merge_flight_files(records: dict[int, dict[str, Any]], dead: set[int], host: str) -> None:
    """For dead ranks on this host, what their flight file says they were doing when they died, and the
    signal and stack of their fault log if they crashed."""
    for rank in dead:
        record = records.get(rank)
        if record is None or record.get("host") != host or not record.get("flight"):
            continue
        apply_flight(record, read_flight(record["flight"]))
        record["state"] = "dead"
        apply_fault_log(record, fault_log_path(os.path.dirname(record["flight"]), rank))


def apply_fault_log(record: dict[str, Any], path: str) -> None:
    """A crashed rank's signal (`signal`), and the stack it died with, in place of its last published one
    (a heartbeat old); a rank that died of a Python error keeps the stack where the error was raised."""
    fatal = read_fault_log(path)
    if fatal is None:
        return
    record["signal"] = fatal.name
    if fatal.stack and not record.get("error"):
        record["stack"] = [frame.to_list() for frame in fatal.stack]
        record["died_here"] = True


def refresh_from_flight(records: dict[int, dict[str, Any]], host: str, skip: set[int]) -> None:
    """For live ranks on this host: the call their flight file shows them in, where their last published
    record does not know it yet. A record is up to a heartbeat old, and a post-mortem decides within
    milliseconds of a peer's death, when the others have just entered the collective it broke; the
    flight file is written as each call enters. Only a record that says its rank is in no collective is
    brought up to date: one that says its call failed (its own post-mortem's) stands, as the rank may have
    caught the error and gone on, and the failure is what the judge must compare. A call the flight file
    shows failed (the same broken collective, on a rank that had not yet published its own post-mortem)
    is brought in with the error of the rank's exit record, if it has written one."""
    now = time.time()
    for rank, record in records.items():
        if (rank in skip or record.get("host") != host or not record.get("flight") or record.get("state") != "running"
                or record.get("current") or record.get("error")):
            continue
        fingerprints = read_flight(record["flight"])
        if not fingerprints or fingerprints[-1].get("state") not in ("in", "failed"):
            continue
        last = fingerprints[-1]
        known = [int(fp.get("index") or 0) for fp in record.get("recent") or []]
        if last.get("index", 0) <= max(known, default=0):
            continue
        record["current"] = last
        record.pop("stack", None)  # taken before it made this call
        if last.get("state") == "in":
            record["waited"] = max(0.0, now - float(last.get("time") or now))
            continue
        record["waited"] = 0.0
        error = _exit_record(os.path.join(os.path.dirname(record["flight"]), f"rank-{rank}.exit.json")).get("error")
        if error:
            record["error"] = error


def _exit_record(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def apply_flight(record: dict[str, Any], fingerprints: list[dict[str, Any]]) -> None:
    if not fingerprints:
        return
    record["python_seqs"] = seqs_by_group((fp.get("group"), fp.get("seq")) for fp in fingerprints)
    record["history_complete"] = fingerprints[0].get("index") == 1  # the file still holds the first call
    last = fingerprints[-1]
    if last.get("state") in ("in", "failed"):
        record["current"] = last
        record["waited"] = record.get("waited") or 0.0
        record["recent"] = fingerprints[-RECENT - 1 : -1]
    else:
        record["current"] = None
        record["recent"] = fingerprints[-RECENT:]


def records_from_run_dir(run_dir: str, world_size: int | None = None) -> dict[int, dict[str, Any]]:
    """Records rebuilt from the meta and flight files ranks left in a run directory (no store needed)."""
    records: dict[int, dict[str, Any]] = {}
    try:
        names = os.listdir(run_dir)
    except OSError:
        return records
    for name in names:
        if not (name.startswith("rank-") and name.endswith(".meta.json")):
            continue
        try:
            with open(os.path.join(run_dir, name), encoding="utf-8") as handle:
                meta = json.load(handle)
            rank = int(meta["rank"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        record: dict[str, Any] = {"rank": rank, "pid": meta.get("pid"), "host": meta.get("host"), "hb": 0}
        record["flight"] = os.path.join(run_dir, f"rank-{rank}.flight")
        alive = meta.get("host") == this_host() and meta.get("pid") and pid_alive(int(meta["pid"]))
        record["state"] = "running" if alive else "dead"
        apply_flight(record, read_flight(record["flight"]))
        # The flight file holds every Python-issued collective up to its size: an empty one is a history too.
        record.setdefault("recent", [])
        exit_record = _exit_record(os.path.join(run_dir, f"rank-{rank}.exit.json"))
        record.update({k: exit_record[k] for k in ("error", "seqs", "stack") if k in exit_record})
        if exit_record.get("exited"):
            record["state"] = "exited"
        if record["state"] == "dead":  # not a rank that finished and then aborted in torch's teardown
            apply_fault_log(record, fault_log_path(run_dir, rank))
        records[rank] = record
    return records


def exception_stack(exc: BaseException) -> list[list[Any]]:
    """The stack where an exception was raised, innermost first, as records carry stacks."""
    from .callsite import stack_of

    traceback = exc.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    return [f.to_list() for f in stack_of(traceback.tb_frame)] if traceback is not None else []


def write_exit_record(runtime: Any, exc: BaseException | None) -> None:
    """`rank-<r>.exit.json`, for `records_from_run_dir`: the error, the stack where it was raised (innermost
    first) and every group's sequence number; or, with no exception, that the rank left on its own (at
    interpreter exit, which an error record already written must outlive)."""
    path = os.path.join(runtime.run_dir, f"rank-{runtime.rank}.exit.json")
    if exc is None:
        if os.path.exists(path):
            return
        record: dict[str, Any] = {"exited": True, "seqs": runtime.sequence_numbers()}
    else:
        record = {"error": short_error(exc), "seqs": runtime.sequence_numbers(), "stack": exception_stack(exc)}
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)
