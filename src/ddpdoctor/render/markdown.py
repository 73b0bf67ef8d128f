"""Findings as markdown, to paste into an issue or a pull-request comment (GitHub's flavour): `check`'s and a
recorded run's. Explain's diagnoses have their own layout (`explain_markdown.py`), built on the helpers here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..findings import Finding
from .registry import write

if TYPE_CHECKING:
    from rich.console import Console

    from ..reports import Report


def longest_run(text: str, char: str) -> int:
    longest = current = 0
    for c in text:
        current = current + 1 if c == char else 0
        longest = max(longest, current)
    return longest


def code_span(text: str) -> str:
    """`text` as inline code that its own backticks cannot end (CommonMark: a longer run of backticks)."""
    ticks = "`" * (longest_run(text, "`") + 1)
    padding = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{padding}{text}{padding}{ticks}"


def code_block(lines: Sequence[str], language: str = "text") -> list[str]:
    """A fenced block that none of its lines can end: the fence is longer than any run of backticks in
    them."""
    fence = "`" * max(3, *(longest_run(line, "`") + 1 for line in lines))
    return [fence + language, *lines, fence]


def print_findings_markdown(report: Report, console: Console) -> None:
    write(console, findings_markdown(report.findings))


def findings_markdown(findings: Sequence[Finding]) -> str:
    if not findings:
        return "ddpdoctor: no findings.\n"
    count = len(findings)
    lines = [f"**ddpdoctor: {count} finding{'s' if count != 1 else ''}**", ""]
    for finding in findings:
        where = f"{code_span(str(finding.location))}: " if finding.location else ""
        label = finding.code or finding.class_
        # the message is ddpdoctor's sentence (its `code` spans are meant); the places are the program's text
        lines.append(f"- {where}**{label}** {finding.message.replace(chr(10), ' ')}")
        lines += [f"  - also at {code_span(str(extra))}" for extra in finding.locations[1:]]
        if finding.fix is not None:
            lines.append(f"  - fix: {finding.fix.message.replace(chr(10), ' ')}")
        if finding.evidence:
            shown = [_rank_label(e.rank, e.text) + e.text for e in finding.evidence]
            lines += ["", *("    " + line for line in code_block(shown)), ""]
        if finding.code:
            lines.append(
                f"  - class {code_span(finding.class_)}; {code_span('ddpdoctor rules ' + finding.code)}"
            )
    return "\n".join(lines) + "\n"


def _rank_label(rank: int | None, text: str) -> str:
    """`[rank N] ` before a line of evidence, unless the line already starts by naming its rank."""
    named = (f"rank {rank}:", f"rank {rank} ", f"[rank {rank}]", f"[rank{rank}]")
    if rank is None or text.lstrip().startswith(named):
        return ""
    return f"[rank {rank}] "
