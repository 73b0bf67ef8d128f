"""The summary `ddpdoctor run` prints when a job ends with findings that no panel showed: one line per
finding of report.json (severity, class, the user's line, the ranks that found it, what it is), its fix
below it. Errors the guard reported as a panel get one line that points to it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO

from ..findings import Finding, Severity
from .console import make_console

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def counted(findings: Sequence[Finding]) -> str:
    """`2 warnings, 1 error`: the findings counted by severity, most severe first."""
    parts = []
    for severity in sorted(Severity, key=lambda s: -s.rank):
        count = sum(1 for f in findings if f.severity is severity)
        if count:
            parts.append(f"{count} {severity.value}{'s' if count > 1 else ''}")
    return ", ".join(parts)


def where(finding: Finding) -> str:
    """The finding's first location as `path:line`, and the ranks that found it."""
    from .paths import short_path

    parts = []
    if finding.location is not None:
        line = finding.location.line
        parts.append(short_path(finding.location.path) + (f":{line}" if line is not None else ""))
    ranks = finding.facts.get("found_by_ranks") or []
    if ranks:
        parts.append(f"(rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)})")
    return " ".join(parts)


def render_summary(
    findings: Sequence[Finding], *, shown: Sequence[Finding] = (), report_path: str | None = None,
    stream: IO[str] | None = None,
) -> None:
    """Print the summary on `stream` (stderr). `shown`: the findings already printed as panels."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.text import Text

    console = make_console(file=stream, stderr=stream is None, soft_wrap=False)
    title = Text("ddpdoctor summary: ", style="bold")
    title.append(counted(findings))
    if report_path:
        title.append(f" (all of it in {report_path})")
    parts: list[object] = [title]
    for finding in findings:
        head = Text("  ")
        head.append(finding.severity.value, style=_STYLE[finding.severity])
        head.append(f" [{finding.class_}] ", style="bold")
        head.append(where(finding))  # the user's paths and names: a Text, never markup
        parts.append(head)
        if finding in shown:
            parts.append(Padding(Text("reported above", style="dim"), (0, 0, 0, 4), expand=False))
            continue
        body = Text(finding.message)
        if finding.fix is not None:
            body.append("\nfix: ", style="green")
            body.append(finding.fix.message)
        parts.append(Padding(body, (0, 0, 0, 4), expand=False))
    console.print(Group(*parts))  # type: ignore[arg-type]
