"""The one report for the whole run on disk (`report.json`, each job's `job-<n>/rank-<r>.jsonl`) and where
the ranks left it; printed by `render` (its layout is `ddpdoctor.render.guard_text`)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ..findings import Finding, dumps, loads
from ..records import JOB_FOLDER, CallRecord
from ..render.registry import render as render_report  # imported with the guard; rich only when printing
from ..reports import GuardReport
from .protocol import REPORT_FILE, RunDir, atomic_write_json

_TMP = re.compile(r"\.tmp\d*$")


def render(findings: Iterable[Finding], stream: Any = None) -> None:
    """Print findings as the guard's report (its layout: `ddpdoctor.render.guard_text`), on stderr unless
    `stream` is given. Rendered whole, then written at once: a rank that torchrun stops mid-report leaves
    either all of it on the terminal or none (then `ddpdoctor run` prints it from the files), not a cut-off
    panel."""
    from ..render.console import make_console

    out = stream or sys.stderr
    console = make_console(file=out, soft_wrap=False)
    with console.capture() as captured:
        render_report(GuardReport(tuple(findings)), "text", console)
    out.write(captured.get())
    out.flush()


def write_report(report_dir: str, findings: list[Finding]) -> str:
    os.makedirs(report_dir, exist_ok=True)
    path = RunDir(report_dir).report
    atomic_write_json(path, None, text=dumps(findings) + "\n")
    return path


def merge_report(report_dir: str, findings: Iterable[Finding], *, lead: Finding | None = None,
                 dropping: Iterable[Finding] = ()) -> str:
    """Add `findings` to the report.json in `report_dir`, one per finding key, and `lead` (a verdict) before
    everything else; a finding whose key is kept already takes its place (its rank's newer word), one in
    `dropping` leaves. Outside `ddpdoctor run` there is no launcher to gather the ranks' findings at the
    end, so each rank adds its own as it finds them: a rank that is SIGKILLed afterwards (Lightning's
    launcher kills the others the moment one process dies) has already left them."""
    os.makedirs(report_dir, exist_ok=True)
    path = RunDir(report_dir).report
    with _locked(report_dir):
        try:
            with open(path, encoding="utf-8") as handle:
                kept = loads(handle.read())
        except (OSError, ValueError):
            kept = []
        gone = {finding_key(finding) for finding in dropping}
        if lead is not None:
            gone.add(finding_key(lead))
        merged = {finding_key(f): f for f in kept if finding_key(f) not in gone}
        for finding in findings:
            merged[finding_key(finding)] = finding  # in place where the key was kept, else appended
        items = ([lead] if lead is not None else []) + list(merged.values())
        atomic_write_json(path, None, text=dumps(items) + "\n")
    return path


def finding_key(finding: Finding) -> tuple[str, str]:
    """What makes two ranks' findings one: the class and the message up to its first `;` (where the
    rank-specific detail starts)."""
    return finding.class_, finding.message.split(";")[0]


@contextmanager
def _locked(folder: str) -> Iterator[None]:
    """An exclusive lock on `folder` among this host's processes, for a read-modify-write of a file in it."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def clear_previous(report_dir: str, older_than: float) -> None:
    """Remove the report.json and rank logs (`rank-<r>.jsonl`, at the top or in a job's folder) an earlier run
    left in a reused report directory, before this run writes there: a stale report.json would stand for a
    clean run (rank 0 writes an empty one only where none exists), and a stale rank log for a dead rank
    (whose log is written only where its rank left none). Only files last written before `older_than`
    (this run's start) go, and the job folders they leave empty."""
    _clear_files(report_dir, older_than, top=True)
    try:
        folders = [name for name in os.listdir(report_dir) if JOB_FOLDER.match(name)]
    except OSError:
        return
    for name in folders:
        folder = os.path.join(report_dir, name)
        try:
            if os.stat(folder).st_mtime >= older_than:
                continue  # made by this run
        except OSError:
            continue
        _clear_files(folder, older_than, top=False)
        try:
            os.rmdir(folder)
        except OSError:  # something else is in it, or this run's job wrote there after all
            pass


def _clear_files(folder: str, older_than: float, *, top: bool) -> None:
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        log = _TMP.sub("", name)  # one a rank was stopped while writing
        ours = (top and name == REPORT_FILE) or (
            log.startswith("rank-") and log.endswith(".jsonl") and log[5:-6].isdigit()
        )
        if not ours:
            continue
        path = os.path.join(folder, name)
        try:
            if os.stat(path).st_mtime < older_than:
                os.unlink(path)
        except OSError:
            pass


def write_rank_log(report_dir: str, rank: int, calls: Iterable[CallRecord]) -> str:
    """rank-<r>.jsonl: the last N collectives of one rank, oldest first, one call record a line."""
    os.makedirs(report_dir, exist_ok=True)
    path = os.path.join(report_dir, f"rank-{rank}.jsonl")
    lines = "".join(
        json.dumps({"rank": rank, **call.to_json()}, separators=(",", ":")) + "\n" for call in calls
    )
    # whole or not at all: the launcher may SIGKILL a rank that is still writing
    atomic_write_json(path, None, text=lines)
    return path


def collect_findings(run_dir: str) -> list[Finding]:
    """Every finding the ranks of a run left in its run directory (report.json first), deduplicated."""
    found: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    files = RunDir(run_dir)
    for path in [files.report, *files.finding_files()]:
        try:
            with open(path, encoding="utf-8") as handle:
                items = loads(handle.read())
        except (OSError, ValueError):
            continue
        for finding in items:
            key = finding_key(finding)
            if key not in seen:
                seen.add(key)
                found.append(finding)
    return found
