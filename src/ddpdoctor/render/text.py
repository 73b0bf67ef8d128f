"""Findings for people, in the terminal: ruff's layout (location, code, message, the source line with
the span underlined, the fix), plus the evidence a runtime finding carries.

Generic on purpose: static findings (with a code and a source span), runtime findings from the guard and
diagnoses from `explain` (with evidence lines and ranks) all go through `render_text`.
"""

from __future__ import annotations

import linecache
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

from ..findings import Applicability, Finding, Location, Severity
from ..reports import CheckReport

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "bold yellow", Severity.INFO: "bold blue"}


def render_check(report: CheckReport, console: Console) -> None:
    """`ddpdoctor check`'s text: each finding, then the count and what `--fix` would fix."""
    render_text(report.findings, console)
    if not report.summary:
        return
    fixable = [f for f in report.findings if f.fix and f.fix.edits]
    safe = sum(1 for f in fixable if f.fix and f.fix.applicability == Applicability.SAFE)
    unsafe = 0 if report.unsafe_fixes else len(fixable) - safe
    if report.fixed:
        console.print(f"Fixed {report.fixed} finding{'s' if report.fixed != 1 else ''}.", highlight=False)
    console.print(summary_line(len(report.findings), safe, unsafe), highlight=False, markup=False)


def render_text(findings: Sequence[Finding], console: Console, *, show_source: bool = True,
                show_fix: bool = True) -> None:
    linecache.checkcache()  # files may have just been rewritten by a fix
    for finding in findings:
        render_one(finding, console, show_source=show_source, show_fix=show_fix)


def render_one(
    finding: Finding, console: Console, *, show_source: bool = True, show_fix: bool = True
) -> None:
    loc = finding.location
    head = f"[bold]{escape(str(loc))}[/]: " if loc else ""
    label = finding.code or finding.class_
    marker = ""
    if finding.fix and finding.fix.edits:
        marker = " [cyan]\\[*][/]" if finding.fix.applicability == Applicability.SAFE else " [dim]\\[-][/]"
    console.print(f"{head}[{_STYLE[finding.severity]}]{escape(label)}[/]{marker} {escape(finding.message)}",
                  soft_wrap=True)
    if show_source and loc is not None:
        _snippet(loc, console)
    for ev in finding.evidence:
        where = " ".join(part for part in (
            f"rank {ev.rank}" if ev.rank is not None else "", f"line {ev.line}" if ev.line is not None else ""
        ) if part)
        console.print(
            f"    [dim]|[/] {escape(where + ': ') if where else ''}{escape(ev.text)}", soft_wrap=True
        )
    for extra in finding.locations[1:]:
        console.print(f"    [dim]= also at[/] {escape(str(extra))}", soft_wrap=True)
    if show_fix and finding.fix is not None:
        console.print(f"    [cyan]= fix:[/] {escape(finding.fix.message)}", soft_wrap=True)
    if finding.code and finding.class_ and finding.class_ != "input-error":
        console.print(
            f"    [dim]= class {escape(finding.class_)}; `ddpdoctor rules {escape(finding.code)}`[/]",
            soft_wrap=True,
        )


def _snippet(loc: Location, console: Console) -> None:
    if loc.line is None:
        return
    text = linecache.getline(loc.path, loc.line)
    if not text.strip():
        return
    text = text.rstrip("\r\n").lstrip("\ufeff").expandtabs(1)
    start = (loc.column or 1) - 1
    if loc.end_column and loc.end_line == loc.line:
        end = loc.end_column - 1
    elif loc.end_line and loc.end_line > loc.line:
        end = len(text)
    else:
        end = start + 1  # a point (a syntax error): one caret
    # Very long lines (minified or generated code): a window around the span.
    shift = 0
    if len(text) > _MAX_WIDTH:
        shift = max(0, start - 40)
        text = ("..." if shift else "") + text[shift:shift + _MAX_WIDTH] + "..."
        start, end = (
            start - shift + (3 if shift else 0),
            min(end - shift + (3 if shift else 0), len(text) - 3),
        )
    width = len(str(loc.line))
    gutter = " " * (width + 1)
    console.print(f"[dim]{gutter}|[/]", soft_wrap=True)
    console.print(f"[dim]{loc.line} |[/] {escape(text)}", soft_wrap=True)
    if loc.column is not None:
        underline = " " * start + "^" * max(1, end - start)
        console.print(f"[dim]{gutter}|[/] [red]{underline}[/]", soft_wrap=True)


_MAX_WIDTH = 160


def summary_line(count: int, safe_fixable: int, unsafe_fixable: int) -> str:
    if count == 0:
        return "All checks passed!"
    text = f"Found {count} finding{'s' if count != 1 else ''}."
    if safe_fixable:
        text += f"\n[*] {safe_fixable} fixable with the `--fix` option."
    if unsafe_fixable:
        text += f"\n({unsafe_fixable} more fixable with `--fix --unsafe-fixes`.)"
    return text
