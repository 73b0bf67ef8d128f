"""Deciding, from every rank's published record, whether the job is stuck and why. Pure functions.

A record (one per rank, JSON, see docs/guard.md) says what the rank is doing: `current` (the
collective it is in, with `waited` seconds), `recent` (fingerprints it completed), `seqs` (each group's
sequence number, C++-issued collectives included), `state` (running / exited / failed / dead) and, when
asked, its main thread's `stack`. `decide` compares the waiting ranks with their peers.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

from ..findings import Evidence, Finding, Fix, Location, Severity
from .callsite import COMPILED_GRAPH
from .fingerprint import P2P_OPS, describe, differences

_FIELD_WORDS = {"op": "op", "shapes": "shape", "dtypes": "dtype", "reduce_op": "ReduceOp", "root": "root",
                "metric": "metric"}

FIXES = {
    "collective-divergence": (
        "call the collective on every rank of the group and guard only the side effect (e.g. the print or "
        "save) with the rank test; for Lightning logging use `rank_zero_only=True` (no sync) or log the same "
        "key on every rank; make loop lengths equal (`drop_last=True`, `torch.distributed.algorithms.Join`, "
        "an all-reduced stop flag); give every rank the same shapes and dtypes"
    ),
    # a peer past the position through a collective issued from C++: DDP's gradient all_reduce, in a
    # backward pass the other ranks did not run
    "uneven-steps": (
        "one rank ran a backward pass (DDP issues its gradient all_reduce from C++) that the others did not: "
        "give every rank the same number of batches (`DistributedSampler` with `drop_last=True`, equal "
        "shards), wrap the training loop in `torch.distributed.algorithms.Join([model])` for uneven inputs, "
        "or all-reduce a stop flag every step and leave the loop together; a batch skipped on one rank (a NaN "
        "check) must be skipped on every rank"
    ),
    "dead-rank": (
        "find why that rank died first (its own log: OOM killer, a Python exception, a signal); the other "
        "ranks only waited for it"
    ),
    # a dead rank whose signal says more than "find why it died"
    "dead-rank-killed": (
        "that rank was killed (SIGKILL: the kernel's OOM killer, or a scheduler's memory or time limit): check "
        "`dmesg` / `journalctl -k` for `Out of memory: Killed process` and the job's memory limit; reduce host "
        "memory (DataLoader workers, pinned memory, a dataset loaded whole on every rank) or raise the limit; "
        "the other ranks only waited for it"
    ),
    "dead-rank-crashed": (
        "that rank crashed in native code at the line named: look at the native call made there (an "
        "extension, a `ctypes` call, a CUDA kernel) and at the versions of torch, CUDA/NCCL and compiled "
        "extensions; the other ranks only waited for it"
    ),
    "dead-rank-bus": (
        "that rank got SIGBUS, most often a full `/dev/shm` (DataLoader workers pass batches through it): "
        "give the container more shared memory (`--shm-size`, `--ipc=host`) or use fewer workers; the other "
        "ranks only waited for it"
    ),
    "collective-timeout": (
        "the rank(s) outside the collective are still busy or stuck elsewhere (see their stacks): make every "
        "rank reach the collective, or raise the backend timeout if the work is legitimately slow"
    ),
}


# What a rank's fatal signal usually means, for the report's one line.
_SIGNAL_GLOSS = {
    "SIGKILL": "what the kernel's OOM killer sends, and schedulers enforcing a memory or time limit",
    "SIGABRT": "a native abort: gloo on a size mismatch, a failed check in torch, NCCL or CUDA",
    "SIGSEGV": "a crash in native code (an extension, a driver, CUDA)",
    "SIGBUS": "often a full /dev/shm (DataLoader workers' shared memory)",
}


def how_it_ended(record: dict[str, Any], gloss: bool = True) -> str | None:
    """"killed by SIGKILL" (with `gloss`: ": what the kernel's OOM killer sends, ...") or "exit code 1",
    from the wait status the launcher or a same-host peer read while the dead process was a zombie, or
    the signal the rank's fault log names; None if neither knows."""
    status = record.get("exit_status")
    if status is None:
        if not record.get("signal"):
            return None
        name = str(record["signal"])
    elif int(status) & 0x7F == 0:
        return f"exit code {(int(status) >> 8) & 0xFF}"
    else:
        number = int(status) & 0x7F
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
    meaning = _SIGNAL_GLOSS.get(name) if gloss else None
    return f"killed by {name}" + (f": {meaning}" if meaning else "")


@dataclass
class Verdict:
    class_: str
    headline: str
    rows: dict[int, dict[str, Any]]  # rank -> {state, where, stack, fp, metric}
    group: str | None = None
    seq: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    cause: tuple[int, ...] = ()  # ranks the headline blames (a dead rank): their places come first
    fix: str | None = None  # where the verdict knows more than its class: a key of FIXES

    def finding(self) -> Finding:
        locations = []
        evidence = []
        for rank in sorted(self.rows):
            row = self.rows[rank]
            loc = row.get("location")
            if loc:
                locations.append(Location(loc[0], loc[1], rank=rank))
            evidence.append(Evidence(f"rank {rank}: {row.get('state', '?')}", rank=rank))
        # a renderer names the first location as the finding's place (`path:line: class`)
        locations.sort(key=lambda loc: loc.rank not in self.cause)
        facts = dict(self.facts)
        facts.update({"group": self.group, "seq": self.seq, "ranks": {str(r): _row_facts(v) for r, v in self.rows.items()}})
        return Finding(
            class_=self.class_,
            message=self.headline,
            severity=Severity.ERROR,
            locations=tuple(locations),
            fix=Fix(FIXES.get(self.fix or self.class_, "")),
            evidence=tuple(evidence),
            references=class_references(self.class_),
            facts=facts,
        )


def class_references(slug: str) -> tuple[str, ...]:
    """The catalogue's references for a class, for a finding; none if the catalogue cannot be read."""
    try:
        from ..catalogue import CATALOGUE

        found = CATALOGUE.get(slug)
        return tuple(found.references) if found is not None else ()
    except Exception:  # noqa: BLE001 - the report must not depend on the catalogue loading
        return ()


def _row_facts(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "state": row.get("state"),
        "where": row.get("where"),
        "fingerprint": row.get("fp"),
        "metric": row.get("metric"),
        "stack": row.get("stack") or [],
    }


def short_path(path: str) -> str:
    for marker in (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep):
        at = path.find(marker)
        if at >= 0:
            return path[at + len(marker) :]
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    if rel.startswith(".." + os.sep + ".."):
        marker = os.sep + "site-packages" + os.sep
        at = path.find(marker)
        return path[at + len(marker) :] if at >= 0 else path
    return rel


def where(fp: dict[str, Any] | None, metric: dict[str, Any] | None = None) -> str:
    """The most useful place to name for a fingerprint: the logged metric, the user line, the library line."""
    metric = metric or (fp.get("metric") if fp else None)
    lib = fp.get("library") if fp else None
    site = fp.get("site") if fp else None
    issued = f"{short_path(lib[0])}:{lib[1]}" if lib and (lib[3] not in (None, "torch", "python") or not site) else ""
    if metric:
        text = f"the sync of metric `{metric['name']}`, logged with sync_dist=True"
        if metric.get("path"):
            text += f" at {short_path(metric['path'])}:{metric['line']}"
        if metric.get("hook"):
            text += f" in {metric['hook']}"
        return text + (f" ({issued})" if issued else "")
    parts = [issued] if issued else []
    if site:
        parts.append(f"{short_path(site[0])}:{site[1]}" + (f" in {site[2]}" if site[2] != "<module>" else ""))
    return ", called from ".join(parts) if parts else "an unknown place"


def location_of(fp: dict[str, Any] | None, metric: dict[str, Any] | None, stack: list | None) -> tuple[str, int] | None:
    metric = metric or (fp.get("metric") if fp else None)
    if metric and metric.get("path"):
        return metric["path"], int(metric["line"])
    if fp:
        for key in ("site", "library"):
            if fp.get(key):
                return fp[key][0], int(fp[key][1])
    for frame in stack or []:
        if frame[3] is None:
            return frame[0], int(frame[1])
    if stack:
        return stack[0][0], int(stack[0][1])
    return None


def _on(record: dict[str, Any], group: str, seq: int) -> dict[str, Any] | None:
    current = record.get("current")
    if current and current.get("group") == group and current.get("seq") == seq:
        return current
    for fp in reversed(record.get("recent") or []):
        if fp.get("group") == group and fp.get("seq") == seq:
            return fp
    return None


def _made_from_python(record: dict[str, Any], group: str, seq: int) -> bool | None:
    """Whether a peer issued collective #seq of a group from Python (True), did not (False: it was a C++
    collective, or the peer never made it), or its history cannot tell (None: its ring no longer reaches
    back that far, say after many calls on other groups)."""
    if _on(record, group, seq) is not None:
        return True
    seqs = (record.get("python_seqs") or {}).get(group)
    if "python_seqs" in record:
        if seqs and seq in seqs:
            return True
        if record.get("history_complete") or (seqs and min(seqs) < seq):
            return False
        return None
    # a record without the per-group history: judge from its recent records alone
    recent = [f for f in record.get("recent") or [] if f.get("group") == group]
    if recent and min(f.get("seq", 0) for f in recent) > seq:
        return None
    return False


def _in_group(rank: int, group: str, record_of_waiter: dict[str, Any]) -> bool:
    members = (record_of_waiter.get("groups") or {}).get(group)
    return members is None or rank in members


def describe_rank(record: dict[str, Any] | None, rank: int, dead: set[int]) -> dict[str, Any]:
    """One row of the report for a rank: its state in words, where, stack."""
    if record is None:
        return {"state": "no record (never reached the guard, or died before its first heartbeat)"}
    current = record.get("current")
    metric = record.get("metric")
    stack = record.get("stack") or []
    if not stack and current:
        # decided before the rank published its stack: the frames its call recorded are on it, innermost first
        stack = [frame for frame in (current.get("library"), current.get("site")) if frame]
    # the fingerprint it is in, or the last it completed (the one an exited rank is judged by)
    row: dict[str, Any] = {"stack": stack, "metric": metric, "fp": current or (record.get("recent") or [None])[-1]}
    if rank in dead or record.get("state") == "dead":
        last = current or ((record.get("recent") or [None])[-1])
        how = how_it_ended(record, gloss=False)  # the headline has the gloss; the row stays short
        parts = [how + died_at(record)] if how else []
        if last:
            parts.append(f"{'in' if current else 'after'} {describe(last)}, #{last.get('seq')} of group "
                         f"{last.get('group')}, at {where(last, metric)}")
        row["state"] = "dead" + (f" ({'; '.join(parts)})" if parts else "")
        if record.get("error"):  # its exit record: an exception raised outside a guarded call
            row["state"] += f": {record['error']}"
        row["where"] = where(last, metric) if last else None
        # a rank that crashed outside a collective is placed where it crashed, not at its last collective
        row["location"] = location_of(None if record.get("died_here") and not current else last, metric, stack)
        row["fp"] = last
        return row
    if record.get("state") == "exited":
        row["state"] = "exited (finished its script / destroyed its process group)"
        last = (record.get("recent") or [None])[-1]
        if last:
            row["state"] += f"; its last collective was {describe(last)} at {where(last, None)}"
            row["where"] = where(last, None)
        row["location"] = location_of(last, None, stack)
        return row
    if record.get("state") == "stopped":
        return _describe_stopped(record, row)
    if current:
        waited = record.get("waited")
        verb = "failed in" if current.get("state") == "failed" else "in"
        row["state"] = f"{verb} {describe(current)} (collective #{current.get('seq')} of group {current.get('group')})"
        if waited is not None and verb == "in" and waited >= 0.05:  # not "waiting 0.0 s": it had just entered
            row["state"] += f", waiting {waited:.1f} s"
        if record.get("error"):
            row["state"] += f": {record['error']}"
        row["where"] = where(current, metric)
        row["location"] = location_of(current, metric, stack)
        return row
    if record.get("silent"):
        # its record is heartbeats old: what it says it does is stale (a stopped or stuck process)
        row["state"] = (f"not responding (no heartbeat for {record['silent']:.0f} s"
                        + ("; its process is stopped, SIGSTOP or a debugger" if record.get("process_stopped") else "")
                        + "); last seen running, not in a collective")
        row["location"] = location_of(None, None, stack)
        return row
    row["state"] = "running, not in a collective"
    if _in_backward(stack):  # where DDP's gradient all_reduce runs, issued from C++
        row["state"] = "in backward, not in a Python collective"
    if _in_compiled_graph(stack):  # it may be in one: a compiled graph's are not seen
        row["state"] = "running a compiled graph (torch.compile: its collectives are not seen one by one)"
    if stack:
        top = next((f for f in stack if f[3] is None), stack[0])
        row["state"] += f" (at {short_path(top[0])}:{top[1]} in {top[2]})"
        row["where"] = f"{short_path(top[0])}:{top[1]}"
    row["location"] = location_of(None, None, stack)
    return row


def death_fix(record: dict[str, Any]) -> str | None:
    """The FIXES key for how a dead rank ended, where its signal says more than the class's fix."""
    if record.get("error"):
        return None  # a Python error: its traceback says what to fix
    how = how_it_ended(record, gloss=False) or ""
    if how == "killed by SIGKILL":
        return "dead-rank-killed"
    if how == "killed by SIGBUS":
        return "dead-rank-bus"
    if record.get("died_here"):  # its fault log holds the line it crashed on
        return "dead-rank-crashed"
    return None


def _user_line(stack: list) -> str | None:
    """"train.py:12 in load_batch": the innermost frame of a stack that the user wrote."""
    user = next((f for f in stack if f[3] is None), None)
    return f"{short_path(str(user[0]))}:{user[1]} in {user[2]}" if user else None


def died_at(record: dict[str, Any]) -> str:
    """" at train.py:12 in load_batch": the user's line a crashed rank's fault log shows it died on."""
    line = _user_line(record.get("stack") or []) if record.get("died_here") else None
    return f" at {line}" if line else ""


def died_of_a_failed_collective(record: dict[str, Any] | None) -> bool:
    return ((record or {}).get("current") or {}).get("state") == "failed"


def _in_backward(stack: list) -> bool:
    """Whether a stack is in autograd's backward pass (the innermost frames, torch's)."""
    for frame in stack[:4]:
        if frame[3] != "torch":
            return False
        if frame[2] in ("_engine_run_backward", "backward") and "autograd" in str(frame[0]):
            return True
    return False


def _in_compiled_graph(stack: list) -> bool:
    return any(frame[3] == COMPILED_GRAPH for frame in stack)


def _describe_stopped(record: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """A rank the launcher stopped (no error of its own) because another one died first: `ddpdoctor run`
    saw the order."""
    current = record.get("current")
    if current:
        verb = "failed in" if current.get("state") == "failed" else "in"
        error = f": {record['error']}" if record.get("error") else ""
        row["state"] = (f"{verb} {describe(current)} (collective #{current.get('seq')} of group "
                        f"{current.get('group')}){error}; then stopped by the launcher")
        row["where"] = where(current, record.get("metric"))
        row["location"] = location_of(current, record.get("metric"), record.get("stack"))
        return row
    last = (record.get("recent") or [None])[-1]
    row["state"] = "stopped by the launcher outside a collective"
    if last:
        row["state"] += f"; its last collective was {describe(last)} at {where(last, None)}"
        row["where"] = where(last, None)
    row["fp"] = last
    row["location"] = location_of(last, None, record.get("stack"))
    return row


def died_first(records: dict[int, dict[str, Any]], world_size: int, first: set[int]) -> Verdict:
    """The job ended with nobody waiting in a collective, but `first` died silently (a signal, a C++ abort:
    no Python error) while the others still ran, and the launcher stopped them: the dead rank is the cause
    even though no peer was left waiting on it."""
    causes = []
    lasts = {}
    for rank in sorted(first):
        record = records.get(rank) or {}
        current = record.get("current")
        last = lasts[rank] = current or (record.get("recent") or [None])[-1]
        how = how_it_ended(record) or "process gone, no Python error: a signal such as SIGKILL"
        cause = f"rank {rank} died ({how}){died_at(record)}"
        if last:
            cause += f" {'in' if current else 'after'} {describe(last)} at {where(last, None)}"
        causes.append(cause)
    stopped = [r for r in range(world_size) if (records.get(r) or {}).get("state") == "stopped"]
    headline = "; ".join(causes)
    if stopped:
        headline += f"; the launcher then stopped rank{'s' if len(stopped) > 1 else ''} " + ", ".join(map(str, stopped))
    last = lasts[min(first)]
    return Verdict("dead-rank", headline, _rows(records, world_size, first), last.get("group") if last else None,
                   last.get("seq") if last else None, {"dead": sorted(first), "kind": "died-first"},
                   cause=tuple(sorted(first)), fix=death_fix(records.get(min(first)) or {}))


def decide(
    records: dict[int, dict[str, Any]],
    world_size: int,
    *,
    dead: set[int],
    grace: float,
    hang_after: float,
) -> Verdict | None:
    """A verdict for the job, or None while nothing is decidable yet."""
    waiting = sorted(
        (r for r, rec in records.items() if rec.get("current") and rec["current"].get("op") not in P2P_OPS
         and r not in dead and ((rec.get("waited") or 0) >= grace or rec["current"].get("state") == "failed")),
        key=lambda r: (-(records[r].get("waited") or 0), r),  # records rebuilt from files come in any order
    )
    for waiter in waiting:
        verdict = _judge_waiter(waiter, records, world_size, dead=dead, hang_after=hang_after)
        if verdict is not None:
            return verdict
    return None


def _rows(records: dict[int, dict[str, Any]], world_size: int, dead: set[int]) -> dict[int, dict[str, Any]]:
    return {r: describe_rank(records.get(r), r, dead) for r in range(world_size)}


def mismatch_headline(a: tuple[int, dict[str, Any]], b: tuple[int, dict[str, Any]], diff: list[str],
                      metrics: dict[int, Any] | None = None, completed: bool = False,
                      completed_on: int | None = None) -> str:
    """`shape mismatch: rank 0 all_reduce(SUM) [3] float32 vs rank 1 ... at train.py:12 (collective #4 of
    group 0)`: two ranks' fingerprints of one position, lower rank first. `completed`: both ranks returned
    from it; `completed_on`: that one rank did."""
    if b[0] < a[0]:
        a, b = b, a
    words = " and ".join(_FIELD_WORDS[d] for d in diff) or "sequence"
    site_a = where(a[1], (metrics or {}).get(a[0]))
    site_b = where(b[1], (metrics or {}).get(b[0]))
    at = f" at {site_a}" if site_a == site_b else f" at {site_a} vs {site_b}"
    tail = "; the backend completed it anyway, so results differ between ranks" if completed else ""
    if completed_on is not None and not completed:
        tail = f"; rank {completed_on} returned from it anyway, with wrong data"
    return (f"{words} mismatch: rank {a[0]} {describe(a[1])} vs rank {b[0]} {describe(b[1])}{at} "
            f"(collective #{a[1].get('seq')} of group {a[1].get('group')}{tail})")


def _earlier_mismatch(
    waiter: int, mine: dict[str, Any], records: dict[int, dict[str, Any]], members: list[int]
) -> tuple[str, Any, Any, list[str]] | None:
    """The first position, in the waiter's order, that the waiter and a peer both passed with different
    calls, from the recent records both published: (headline, group, seq, differing fields)."""
    ours = {(f.get("group"), f.get("seq")): f for f in mine.get("recent") or [] if (f.get("seq") or -1) >= 0}
    found: tuple[int, int, dict[str, Any], dict[str, Any], list[str]] | None = None
    for peer in members:
        for theirs in (records.get(peer) or {}).get("recent") or []:
            own = ours.get((theirs.get("group"), theirs.get("seq")))
            if own is None or own.get("state") == "failed" or theirs.get("state") == "failed":
                continue
            diff = differences(own, theirs)
            if diff and (found is None or own.get("index", 0) < found[0]):
                found = (own.get("index", 0), peer, own, theirs, diff)
    if found is None:
        return None
    _, peer, own, theirs, diff = found
    headline = mismatch_headline((waiter, own), (peer, theirs), diff, completed=True)
    return headline, own.get("group"), own.get("seq"), diff


def _judge_waiter(
    waiter: int, records: dict[int, dict[str, Any]], world_size: int, *, dead: set[int], hang_after: float
) -> Verdict | None:
    mine = records[waiter]
    fp = mine["current"]
    group, seq = fp.get("group"), fp.get("seq")
    waited = mine.get("waited") or 0.0
    failed = fp.get("state") == "failed"
    members = [r for r in range(world_size) if r != waiter and _in_group(r, group, mine)]

    # 0. an earlier position both ranks passed with different calls: gloo completes mismatched calls of
    # equal shapes (two Lightning metrics synced against each other), and what hangs later follows from it
    earlier = _earlier_mismatch(waiter, mine, records, members)
    if earlier is not None:
        return Verdict("collective-divergence", earlier[0], _rows(records, world_size, dead), earlier[1], earlier[2],
                       {"kind": "completed-mismatch", "mismatch": earlier[3]})

    # 1. the same position, something else: decidable at once
    for peer in members:
        record = records.get(peer)
        if record is None or seq is None or seq < 0:
            continue
        theirs = _on(record, group, seq)
        if theirs is None:
            continue
        diff = differences(fp, theirs)
        if diff:
            metrics = {waiter: mine.get("metric"), peer: record.get("metric")}
            # gloo completes a call that receives less than it expected (same op, other sizes): that rank
            # went on with wrong data
            completed_on = peer if theirs.get("state") == "done" and "op" not in diff else None
            headline = mismatch_headline((waiter, fp), (peer, theirs), diff, metrics, completed_on=completed_on)
            return Verdict("collective-divergence", headline, _rows(records, world_size, dead), group, seq,
                           {"mismatch": list(diff), "kind": "mismatch"})

    # 2. a peer already past this position with something Python never saw (C++-issued, e.g. DDP buckets).
    # Before the dead-rank check: such a mismatch often kills both ranks (gloo aborts on the size
    # mismatch), and the peer's death is then the consequence, not the cause.
    for peer in members:
        record = records.get(peer)
        if record is None or seq is None or seq < 0:
            continue
        their_seq = (record.get("seqs") or {}).get(group)
        if their_seq is None or their_seq <= seq:
            continue
        if "recent" not in record:
            continue  # an ordinary heartbeat record: its history is published only once asked for
        if _made_from_python(record, group, seq) is not False:
            continue  # it made this call (a gather's non-root finishes early), or its history cannot tell
        verb = "was in" if mine.get("state") == "dead" else "waits in"
        stack = record.get("stack") or []
        user = _user_line(stack)
        there = ""
        if user:
            now = "died" if record.get("state") == "dead" else "now in backward" if _in_backward(stack) else "now"
            there = f" ({now} at {user})"
        if _in_compiled_graph(stack):
            # its stack now, not where it made the call: a hint, worded as one
            passed_with = ("a collective issued outside torch.distributed's Python functions (it runs a "
                           "torch.compile'd graph, whose collectives are such)")
        else:
            passed_with = "a collective issued outside Python (from C++, e.g. DDP's gradient all_reduce)"
        if their_seq == seq + 1:
            # #seq is the last it issued: it may well be waiting in it still, not past it
            peer_did = f"rank {peer}'s #{seq} is {passed_with}{there}"
        else:
            peer_did = f"rank {peer} already passed #{seq} with {passed_with} and got to #{their_seq}{there}"
        headline = (
            f"rank {waiter} {verb} {describe(fp)} at {where(fp, mine.get('metric'))} (collective #{seq} of group "
            f"{group}), but {peer_did}"
        )
        return Verdict("collective-divergence", headline, _rows(records, world_size, dead), group, seq,
                       {"kind": "passed", "peer": peer},
                       fix=None if _in_compiled_graph(stack) else "uneven-steps")

    # 3. a peer that left: exited normally (divergence) or died (dead-rank). Of the dead, one that died
    # failing in a collective ("Connection reset by peer": torchrun then stopped it) is the consequence of
    # another's death, and is named only when no other death explains it.
    for peer in sorted(members, key=lambda p: died_of_a_failed_collective(records.get(p))):
        record = records.get(peer)
        if peer in dead or (record is not None and record.get("state") == "dead"):
            # its own Python error first (an uncaught exception), else how its process ended
            how = (record.get("error") or how_it_ended(record)) if record is not None else None
            headline = (
                f"rank {peer} died ({how or 'no heartbeat / process gone'}){died_at(record or {})} while rank "
                f"{waiter} waits in "
                f"{describe(fp)} at {where(fp, mine.get('metric'))}"
            )
            return Verdict("dead-rank", headline, _rows(records, world_size, dead), group, seq,
                           {"dead": sorted(dead | {peer}), "kind": "dead"}, cause=(peer,),
                           fix=death_fix(record or {}))
        if record is not None and record.get("state") == "exited" and _made_from_python(record, group, seq) is False:
            # (a peer that made this call and then left is not blamed: a gather's non-root ranks finish
            # their part before the root has everyone's)
            headline = (
                f"rank {waiter} waits in {describe(fp)} at {where(fp, mine.get('metric'))}, but rank {peer} finished "
                f"without calling it (collective #{seq} of group {group})"
            )
            return Verdict("collective-divergence", headline, _rows(records, world_size, dead), group, seq,
                           {"kind": "exited", "missing": [peer]})

    # 4. peers merely elsewhere: a verdict only after hang_after (they may just be slow)
    if waited < hang_after and not failed:
        return None
    absent = [p for p in members if records.get(p) is not None and _on(records[p], group, seq) is None]
    missing = [p for p in members if records.get(p) is None]
    if not absent and not missing:
        if failed:
            return None
        headline = (
            f"every rank is in {describe(fp)} (collective #{seq} of group {group}) and none has completed it for "
            f"{waited:.0f} s"
        )
        return Verdict("collective-timeout", headline, _rows(records, world_size, dead), group, seq, {"kind": "stuck"})
    elsewhere = []
    in_other = False
    for peer in absent:
        row = describe_rank(records[peer], peer, dead)
        elsewhere.append(f"rank {peer} is {row['state']}")
        if records[peer].get("current"):
            in_other = True
    for peer in missing:
        elsewhere.append(f"rank {peer} never reported")
    class_ = "collective-divergence" if in_other else "collective-timeout"
    headline = (
        f"rank {waiter} {'failed' if failed else 'has waited ' + format(waited, '.0f') + ' s'} in {describe(fp)} at "
        f"{where(fp, mine.get('metric'))} (collective #{seq} of group {group}); " + "; ".join(elsewhere)
    )
    return Verdict(class_, headline, _rows(records, world_size, dead), group, seq,
                   {"kind": "elsewhere", "absent": absent + missing})
