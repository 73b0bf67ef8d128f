"""The guard's report for people: one panel per finding, with a table of where each rank is when the finding
has one (`facts["ranks"]`: rank -> its state, the place it waits and its stack).

Printed on stderr by a rank (or by `ddpdoctor run` from the files the ranks left) while the job is still
running, through `guard.report.render`, which writes it in one piece.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..findings import Finding, Severity
from ..guard.judge.places import path_tail, short_path
from .reports import GuardReport


def render_guard(report: GuardReport, console: Console) -> None:
    for finding in report.findings:
        console.print(_panel(finding, console.width))


def _panel(finding: Finding, width: int) -> Panel:
    body = Table.grid(padding=(0, 1))
    body.add_column()
    ranks = ranks_of(finding)
    # without a per-rank table, a message's clauses (one per rank) read better one a line
    message = finding.message if ranks else finding.message.replace("; ", "\n")
    body.add_row(Text(message, style="bold"))
    if ranks:
        body.add_row(_rank_table(ranks, width))
    if finding.fix:
        body.add_row(Text("fix: " + finding.fix.message, style="green"))
    title = Text(f"ddpdoctor: {finding.class_}")
    border = "red" if finding.severity is Severity.ERROR else "yellow"
    return Panel(body, title=title, title_align="left", border_style=border)


def _rank_table(ranks: dict[str, Any], width: int) -> Table:
    tail = max(20, min(60, width // 3 - 6))  # the stack column's share of the width
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
    return table


def ranks_of(finding: Finding) -> dict[str, Any]:
    """The guard's per-rank facts of a finding: rank (a string, as JSON keys are) -> state, where, stack."""
    ranks = (finding.facts or {}).get("ranks")
    # an audit's finding may name its ranks as a plain list: that is not the guard's table of rank states
    return dict(ranks) if isinstance(ranks, Mapping) else {}
