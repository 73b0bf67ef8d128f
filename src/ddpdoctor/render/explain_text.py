"""`ddpdoctor explain` for people: each diagnosis (a Finding, best first) with what happened in this log, its
facts, the fix and the log lines that show it; or, when nothing was diagnosed, one line on what the log is.

Everything shown comes from the Findings (`explain/report.py` names their facts) and the catalogue, so the
same text can be rendered from `--format json`'s output read back with `findings.loads`.
"""

from __future__ import annotations

import textwrap
from typing import Any

from rich.console import Console
from rich.text import Text

from ..catalogue import CATALOGUE
from ..findings import Evidence, Finding
from ..reports import REPORT_FACTS, ExplainReport, LogKind
from .ranges import compact

# the facts a reader looks for first; the others follow in name order
_FACT_ORDER = (
    "culprit_rank",
    "first_failed_rank",
    "exitcode",
    "signal",
    "ranks",
    "victim_ranks",
    "reporting_ranks",
    "silent_ranks",
)
_NOT_LISTED = frozenset({"occurrences", *REPORT_FACTS})  # shown in their own places, or not at all


def class_id(finding: Finding) -> str:
    """The catalogue's id of the finding's class (`F6`), or its slug when the catalogue does not know it."""
    return CATALOGUE.get(finding.class_).id if finding.class_ in CATALOGUE else finding.class_


def what_happened(finding: Finding) -> list[str]:
    return [str(sentence) for sentence in finding.facts.get("what_happened") or ()]


def fixes(finding: Finding) -> list[str]:
    """The fix specific to this log first, then the others."""
    own = [finding.fix.message] if finding.fix and finding.fix.message else []
    return own + [str(f) for f in finding.facts.get("other_fixes") or () if f not in own]


def listed_facts(finding: Finding) -> list[tuple[str, Any]]:
    facts = {k: v for k, v in finding.facts.items() if k not in _NOT_LISTED}
    first = [(k, facts[k]) for k in _FACT_ORDER if k in facts]
    rest = sorted((k, v) for k, v in facts.items() if k not in _FACT_ORDER)
    return first + rest


def fact_value(value: Any) -> str:
    return compact(value) if isinstance(value, (list, tuple)) else str(value)


def evidence_text(evidence: Evidence) -> str:
    return f"[rank {evidence.rank}] {evidence.text}" if evidence.rank is not None else evidence.text


def confidence_text(finding: Finding) -> str:
    return f"confidence {finding.confidence:.2f}" if finding.confidence is not None else ""


def _indented(console: Console, text: str, indent: int, style: str = "") -> None:
    # Wrapped here rather than by rich so that continuation lines keep the indent and no line is padded.
    width = max(40, console.width - 1)
    wrapped = textwrap.fill(
        text, width=width, initial_indent=" " * indent, subsequent_indent=" " * indent, break_on_hyphens=False
    )
    console.print(Text(wrapped, style=style), soft_wrap=True)


def render_explain(report: ExplainReport, console: Console) -> None:
    if not report.findings:
        console.print(Text(nothing_found(report)), soft_wrap=True)
        return
    count = len(report.findings)
    lines = report.lines_read
    _indented(
        console,
        f"read {lines:,} line{'' if lines == 1 else 's'} from {', '.join(report.sources)}: "
        f"{count} diagnos{'is' if count == 1 else 'es'}, best first",
        0,
        "dim",
    )
    for number, finding in enumerate(report.findings, 1):
        _diagnosis(console, number, finding)


def _diagnosis(console: Console, number: int, finding: Finding) -> None:
    console.print()
    header = Text()
    header.append(f"{number}. ", style="bold")
    header.append(finding.class_, style="bold red" if number == 1 else "bold yellow")
    header.append(f"  {class_id(finding)}  {confidence_text(finding)}".rstrip(), style="dim")
    console.print(header)
    _indented(console, finding.message, 3, "bold")
    sentences = what_happened(finding)
    if sentences:
        _indented(console, "What happened", 3, "bold")
        for sentence in sentences:
            _indented(console, sentence, 5)
    facts = listed_facts(finding)
    if facts:
        _indented(console, "Facts", 3, "bold")
        for key, value in facts:
            shown = fact_value(value)
            _indented(console, f"{key}: {shown if len(shown) <= 160 else shown[:157] + '...'}", 5)
    all_fixes = fixes(finding)
    if all_fixes:
        _indented(console, "Fix", 3, "bold green")
        _indented(console, all_fixes[0], 5)
        for other in all_fixes[1:3]:
            _indented(console, "or: " + other, 5, "dim")
    if finding.evidence:
        _indented(console, "Evidence", 3, "bold")
        for evidence in finding.evidence:
            line = f"line {evidence.line}: {evidence_text(evidence)}"
            _indented(console, line if len(line) <= 300 else line[:297] + "...", 5, "cyan")
    refs = ", ".join(finding.references[:2])
    _indented(
        console, f"more: ddpdoctor rules {class_id(finding)}" + (f" · {refs}" if refs else ""), 3, "dim"
    )


def nothing_found(report: ExplainReport) -> str:
    """One line on logs with nothing to diagnose (what they are instead); `verbose` adds what was looked
    for."""
    sources = ", ".join(report.sources)
    count = report.lines_read
    lines_read = f"{count:,} line{'' if count == 1 else 's'}"
    end = report.finished_at
    if report.kind is LogKind.EMPTY:
        line = f"ddpdoctor explain: {sources}: empty ({lines_read}), nothing to explain."
    elif report.kind is LogKind.FINISHED and end is not None:
        who = " and ".join(report.launchers) or "distributed"
        line = (f"ddpdoctor explain: no failure in {sources} ({lines_read}): the {who} job ran to its end "
                f"(line {end.line}: {end.text[:100]!r}).")
    else:
        line = (f"ddpdoctor explain: no distributed-training failure in {sources} ({lines_read}): no known "
                "failure message, and nothing from a launcher, a rank or torch.distributed.")
    if not report.verbose:
        if report.kind in (LogKind.EMPTY, LogKind.FINISHED):
            return line
        return line + " (--verbose: what was looked for)"
    out = [line, "Looked for:"]
    out += [f"  - {item}" for item in report.looked_for]
    out.append("  - the marks of a job that started and then stopped with no error (a likely hang): launcher "
               "banners, rank prefixes, torchrun's death signal, a shell's `Killed`, Slurm's CANCELLED")
    out.append("If this log shows a distributed failure, please report it with the log attached.")
    return "\n".join(out)

