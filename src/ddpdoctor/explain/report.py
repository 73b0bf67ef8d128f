"""What `explain` reports: each diagnosis as one `Finding`, with what the diagnosis decided as named facts.

The renderers (`ddpdoctor.render`) read only these Findings (and the few facts about the logs read in
`ExplainReport`), so `--format json` carries everything the text shows, and `findings.loads` gives it back.
Facts added here, beside those the signatures extracted (`culprit_rank`, `exception`, `user_frame`, ...):

- `signature`: the id of the catalogue signature that decided the class (absent for a log that just stops)
- `refinements`: the ids of the refinements that applied
- `what_happened`: the sentences written for this log from its facts, most specific first
- `other_fixes`: the fixes after the finding's own `fix`, best first

The finding's locations are the line the user wrote (from the traceback), when the log shows one, and then
the line of the log that decided it (`path` is the log file; none for stdin).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..findings import Finding
from ..reports import ExplainReport, LogLine
from .diagnose import Diagnosis, Explanation, LogKind

# the facts this module adds: a renderer shows them in their own places, not in the list of the log's facts


def reported_finding(diagnosis: Diagnosis) -> Finding:
    finding = diagnosis.finding
    facts: dict[str, Any] = dict(finding.facts)
    if diagnosis.signature:
        facts["signature"] = diagnosis.signature
    if diagnosis.refinements:
        facts["refinements"] = list(diagnosis.refinements)
    facts["what_happened"] = list(diagnosis.explanation)
    facts["other_fixes"] = fixes(diagnosis)[1 if finding.fix and finding.fix.message else 0:]
    locations = finding.locations
    if diagnosis.log_line is not None:
        locations = (*locations, diagnosis.log_line)
    return replace(finding, facts=facts, locations=locations)


def fixes(diagnosis: Diagnosis) -> list[str]:
    """The fix specific to this log first, then the class's general ones (or those that fit a log with no
    error in it)."""
    finding = diagnosis.finding
    out: list[str] = []
    if finding.fix and finding.fix.message:
        out.append(finding.fix.message)
    others = diagnosis.knowledge.failure.fixes if diagnosis.other_fixes is None else diagnosis.other_fixes
    out += [f for f in others if f not in out]
    return out


def explain_report(explanation: Explanation, *, verbose: bool = False) -> ExplainReport:
    """The diagnoses as Findings, with what a renderer says about the logs themselves (their names, their
    size, what they are when nothing was diagnosed)."""
    end = explanation.job_end
    finish = end.finish if end is not None and explanation.kind is LogKind.FINISHED else None
    return ExplainReport(
        findings=tuple(reported_finding(d) for d in explanation.diagnoses),
        sources=tuple(explanation.sources),
        lines_read=explanation.stats.lines,
        kind=explanation.kind,
        launchers=tuple(end.launchers) if end is not None else (),
        finished_at=LogLine(finish.line, finish.text) if finish is not None else None,
        looked_for=tuple(explanation.looked_for),
        verbose=verbose,
    )
