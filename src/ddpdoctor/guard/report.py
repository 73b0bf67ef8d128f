"""The one report for the whole job: rich text on stderr, and `report.json` / `rank-<r>.jsonl` on disk."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable
from typing import Any

from ..findings import Finding, dumps, loads
from ..render.console import make_console  # imported with the guard: rich itself only when printing
from .judge.places import path_tail, short_path
from .model import CallRecord
from .protocol import REPORT_FILE, RunDir, atomic_write_json

_TMP = re.compile(r"\.tmp\d*$")



def _console(stream: Any = None) -> Any:
    return make_console(file=stream or sys.stderr, soft_wrap=False)


def render(findings: Iterable[Finding], stream: Any = None) -> None:
    """Print findings as the guard's report (one panel per finding, a per-rank table where there is one)."""
    console = _console(stream)
    # Rendered whole, then written at once: a rank that torchrun stops mid-report leaves either all of it
    # on the terminal or none (then `ddpdoctor run` prints it from the files), not a cut-off panel.
    with console.capture() as captured:
        _panels(console, findings)
    out = stream or sys.stderr
    out.write(captured.get())
    out.flush()


def _panels(console: Any, findings: Iterable[Finding]) -> None:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    for finding in findings:
        body = Table.grid(padding=(0, 1))
        body.add_column()
        message = finding.message if ranks_of(finding) else finding.message.replace("; ", "\n")
        body.add_row(Text(message, style="bold"))
        ranks = (finding.facts or {}).get("ranks") or {}
        if ranks:
            tail = max(20, min(60, console.width // 3 - 6))  # the stack column's share of the width
            table = Table(show_header=True, header_style="bold", expand=False, pad_edge=False)
            table.add_column("rank", justify="right", no_wrap=True)
            # nothing cut with an ellipsis: a long path in a narrow column breaks onto the next line instead;
            # a stack frame is `file.py:31 function`, a deep path losing its head, never its file and line
            table.add_column("state", overflow="fold", min_width=16)
            table.add_column("stack (innermost first)", overflow="fold", min_width=16)
            for rank in sorted(ranks, key=int):
                row = ranks[rank]
                stack = row.get("stack") or []
                frames = [f for f in stack if f[3] is None][:3] or stack[:3]
                stack_text = "\n".join(f"{path_tail(short_path(f[0]), tail)}:{f[1]} {f[2]}" for f in frames)
                state = row.get("state") or "?"
                if row.get("where") and row["where"] not in state:
                    state += f"\n at {row['where']}"
                table.add_row(Text(str(rank)), Text(state), Text(stack_text))
            body.add_row(table)
        if finding.fix:
            body.add_row(Text("fix: " + finding.fix.message, style="green"))
        title = Text(f"ddpdoctor: {finding.class_}")
        console.print(Panel(body, title=title, title_align="left", border_style="red" if finding.severity.value == "error" else "yellow"))


def ranks_of(finding: Finding) -> dict[str, Any]:
    return dict((finding.facts or {}).get("ranks") or {})


def write_report(report_dir: str, findings: list[Finding]) -> str:
    os.makedirs(report_dir, exist_ok=True)
    path = RunDir(report_dir).report
    atomic_write_json(path, None, text=dumps(findings) + "\n")
    return path


def clear_previous(report_dir: str, older_than: float) -> None:
    """Remove the report.json and rank-<r>.jsonl an earlier run left in a reused report directory,
    before this run writes there: a stale report.json would stand for a clean run (rank 0 writes an empty
    one only where none exists), and a stale rank log for a dead rank (whose log is written only where
    its rank left none). Only files last written before `older_than` (this run's start) go."""
    try:
        names = os.listdir(report_dir)
    except OSError:
        return
    for name in names:
        log = _TMP.sub("", name)  # one a rank was stopped while writing
        ours = name == REPORT_FILE or (log.startswith("rank-") and log.endswith(".jsonl") and log[5:-6].isdigit())
        if not ours:
            continue
        path = os.path.join(report_dir, name)
        try:
            if os.stat(path).st_mtime < older_than:
                os.unlink(path)
        except OSError:
            pass


def write_rank_log(report_dir: str, rank: int, calls: Iterable[CallRecord]) -> str:
    """rank-<r>.jsonl: the last N collectives of one rank, oldest first, one call record a line."""
    os.makedirs(report_dir, exist_ok=True)
    path = os.path.join(report_dir, f"rank-{rank}.jsonl")
    lines = "".join(json.dumps({"rank": rank, **call.to_json()}, separators=(",", ":")) + "\n" for call in calls)
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
            key = (finding.class_, finding.message.split(";")[0])
            if key not in seen:
                seen.add(key)
                found.append(finding)
    return found
