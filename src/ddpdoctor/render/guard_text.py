"""The guard's report for people: one panel per finding, with a table of where each rank is when the finding
has one (`facts["ranks"]`: rank -> its state, the place it waits and its stack).

Printed on stderr by a rank (or by `ddpdoctor run` from the files the ranks left) while the job is still
running, through `guard.report.render`, which writes it in one piece.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..findings import Finding, Severity
from ..reports import GuardReport
from .paths import path_tail, short_path


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


_WAITING = re.compile(r", waiting (\d+(?:\.\d+)?) s")


def _rank_table(ranks: dict[str, Any], width: int) -> Table:
    tail = max(20, min(60, width // 3 - 6))  # the stack column's share of the width
    table = Table(show_header=True, header_style="bold", expand=False, pad_edge=False)
    table.add_column("rank", justify="right", no_wrap=True)
    # nothing cut with an ellipsis: a long path in a narrow column breaks onto the next line instead;
    # a stack frame is `file.py:31 function`, a deep path losing its head, never its file and line
    table.add_column("state", overflow="fold", min_width=16)
    table.add_column("stack (innermost first)", overflow="fold", min_width=16)
    for members, state, stack_text in rank_groups(ranks, tail):
        table.add_row(Text(rank_span(members)), Text(state), Text(stack_text))
    return table


def rank_groups(ranks: Mapping[str, Any], tail: int = 60) -> list[tuple[list[int], str, str]]:
    """The table's rows: ranks in the same state at the same place with the same stack share one row
    (at 1,000 ranks the table is a few rows around the outliers, not 1,000); the smallest groups, the
    outliers, come first. Each row: (its ranks, the state in words, the stack's lines)."""
    groups: dict[tuple[str, str], list[int]] = {}
    waited: dict[tuple[str, str], list[float]] = {}
    for rank in sorted(ranks, key=int):
        row = ranks[rank]
        stack = row.get("stack") or []
        frames = [f for f in stack if f[3] is None][:3] or stack[:3]
        stack_text = "\n".join(f"{path_tail(short_path(f[0]), tail)}:{f[1]} {f[2]}" for f in frames)
        state = row.get("state") or "?"
        if row.get("where") and row["where"] not in state:
            state += f"\n at {row['where']}"
        # how long each has waited differs by a heartbeat or two: not a different state
        key = (_WAITING.sub("", state), stack_text)
        groups.setdefault(key, []).append(int(rank))
        waited.setdefault(key, []).extend(float(w) for w in _WAITING.findall(state))
    rows = []
    for key, members in sorted(groups.items(), key=lambda item: (len(item[1]), item[1][0])):
        state, stack_text = key
        times = waited[key]
        if times:
            low, high = min(times), max(times)
            span = f"{low:.1f} s" if low == high else f"{low:.1f}–{high:.1f} s"
            head, sep, rest = state.partition("\n")
            state = f"{head}, waiting {span}{sep}{rest}"
        rows.append((members, state, stack_text))
    return rows


def rank_span(ranks: list[int]) -> str:
    """`5`, or `1–31 (31)`, or `0, 2–9 (9)`: sorted ranks as runs, with the count when more than one."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    text = ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs)
    return text if len(ranks) == 1 else f"{text} ({len(ranks)})"


def ranks_of(finding: Finding) -> dict[str, Any]:
    """The guard's per-rank facts of a finding: rank (a string, as JSON keys are) -> state, where, stack."""
    ranks = (finding.facts or {}).get("ranks")
    # an audit's finding may name its ranks as a plain list: that is not the guard's table of rank states
    return dict(ranks) if isinstance(ranks, Mapping) else {}
