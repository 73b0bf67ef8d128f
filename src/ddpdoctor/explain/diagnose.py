"""The diagnoses of one job's logs: the analysis's classes (analysis.py), the first distributed error
outside the catalogue (errors.py) and the slow-rank reading of a timeout (slowrank.py), in one ranked list."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..findings import Evidence, Finding, Fix, Severity
from . import errors, order, slowrank, stopped
from .analysis import MAX_EVIDENCE, VICTIM_DISCOUNT, Analysis
from .knowledge import KnowledgeBase
from .outcome import Diagnosis, Explanation, LogKind, first_evidence_line, log_location, op_calls
from .scanner import PRE
from .sharded import with_sharded_steps
from .source import BLOCK_SIZE, LogSource

# op_calls is read from here by tests/test_collectives.py; LogKind is the report type's (reports.py)
__all__ = ["Analysis", "Diagnosis", "Explanation", "LogKind", "explain_logs", "op_calls"]


def _moment(source: str, line: int, text: str) -> order.Moment:
    return order.Moment(source, line, order.timestamp(text))


def _first_moment(diagnosis: Diagnosis, default_source: str) -> order.Moment | None:
    """Where a diagnosis's first line is: its earliest evidence line, in the log its deciding line is in."""
    lines = [e for e in diagnosis.finding.evidence if e.line is not None]
    if not lines:
        return None
    first = min(lines, key=lambda e: e.line or 0)
    source = diagnosis.log_line.path if diagnosis.log_line is not None else default_source
    return _moment(source, first.line or 0, first.text)


def _victims_only(diagnosis: Diagnosis) -> bool:
    """A class seen only through its victims (a timeout, a lost peer): no rank named as the culprit."""
    facts = diagnosis.finding.facts
    return "reporting_ranks" in facts and "culprit_rank" not in facts


def _generic_first_failure(analysis: Analysis, fatal_only: bool) -> errors.ErrorHit | None:
    """The first failure of a distributed job whatever its kind: an exception line (with `fatal_only`, one
    its rank died of), a native crash at a log's end, or only the launcher's word that a rank exited with an
    error status."""
    # (a launcher, rank prefixes, torch.distributed: what says the log is a distributed job's)
    distributed = bool(analysis.launcher.exits or analysis.ranks_seen or analysis.starts
                       or analysis.job_end() is not None)
    for tail in analysis.stats.tails:
        analysis.errors.native_end(tail.source, tail.first_line, tail.lines,
                                   analysis.source_ranks.get(tail.source))
    hit = analysis.errors.first_distributed_exception(distributed, fatal_only)
    first = analysis.launcher.first_failure
    if hit is None and first is not None and (first.exitcode or 0) > 0:
        # its own output is not in the log
        hit = errors.launcher_exit(first.rank, first.exitcode or 0, first.line, first.source)
    return hit


def _with_first_error(analysis: Analysis, diagnoses: list[Diagnosis]) -> list[Diagnosis]:
    """The diagnoses, with the job's first failure outside the catalogue (errors.py) when it is the root-cause
    candidate: a known distributed error always; any other first failure when nothing else was diagnosed, or
    when every diagnosed class is seen only through victims and comes after it (order.py). The classes seen
    only through victims are then its consequences: their confidence is discounted, and their explanation
    says which line they follow."""
    hit, confidence = analysis.errors.first_known(), errors.KNOWN_CONFIDENCE
    default_source = analysis.sources[0] if len(analysis.sources) == 1 else ""
    if hit is None:
        if diagnoses and not all(_victims_only(d) for d in diagnoses):
            return diagnoses
        # before other classes, only an exception a rank died of: one it caught and logged caused nothing
        hit, confidence = _generic_first_failure(analysis, bool(diagnoses)), errors.UNKNOWN_CONFIDENCE
        if hit is None:
            return diagnoses
        root = _moment(hit.source, hit.line, hit.text)
        moments = [_first_moment(d, default_source) for d in diagnoses]
        if not all(m is not None and order.role(m, root) is order.Role.CONSEQUENCE for m in moments):
            return diagnoses  # the victims are not known to come after it: it is not their root
    root = _moment(hit.source, hit.line, hit.text)
    first_exit = analysis.launcher.first_failure
    if hit.rank is None and first_exit is not None and first_exit.rank is not None:
        hit = replace(hit, rank=first_exit.rank)  # a line with no rank: the launcher's first failed rank
    if not any("culprit_rank" in d.finding.facts for d in diagnoses):
        diagnoses = [_as_consequence(d, root, confidence, _first_moment(d, default_source))
                     if "reporting_ranks" in d.finding.facts else d for d in diagnoses]
    finding = errors.finding(hit, confidence, analysis.launcher.facts(), None)
    named = Diagnosis(finding=finding, explanation=errors.explanation(hit, dict(finding.facts)),
                      knowledge=errors.knowledge(),
                      signature=hit.known.name if hit.known else "first-failure",
                      log_line=log_location(hit.source, hit.line, hit.rank))
    return sorted([*diagnoses, named], key=lambda d: (-(d.finding.confidence or 0.0), first_evidence_line(d)))


def _as_consequence(
    victim: Diagnosis, root: order.Moment, root_confidence: float, moment: order.Moment | None
) -> Diagnosis:
    """A class seen only through victims, beside the job's first failure: discounted; when it is known to
    come after that failure, it is its consequence, ranked after it."""
    confidence = round((victim.finding.confidence or 0) * VICTIM_DISCOUNT, 2)
    explanation = list(victim.explanation)
    if moment is not None and order.role(moment, root) is order.Role.CONSEQUENCE:
        confidence = min(confidence, round(root_confidence - 0.01, 2))
        explanation.append(f"It came after the job's first failure (line {root.line}): most likely a "
                           "consequence of it, not a cause of its own.")
    return replace(victim, finding=replace(victim.finding, confidence=confidence), explanation=explanation)


def _with_slow_rank(analysis: Analysis, diagnoses: list[Diagnosis]) -> list[Diagnosis]:
    """A timeout that only victims reported, read for a rank busy with long work (slowrank.py): then
    `single-rank-long-section` comes first, the timeout after it; a timeout whose late rank the log cannot
    name at all is reported with less confidence."""
    timeout = next((d for d in diagnoses if d.slug == slowrank.TIMEOUT_SLUG
                    and "culprit_rank" not in d.finding.facts), None)
    if timeout is None:
        return diagnoses
    facts = dict(timeout.finding.facts)
    reporting = set(facts.get("reporting_ranks", []))
    # the ranks the log shows lines of (not those inferred from 0..N-1: a paste of one rank's error block
    # says nothing about whether the others were silent)
    seen = reporting | analysis.ranks_seen | analysis.launcher.ranks
    reports = [slowrank.TimeoutReport(h.rank, h.hit.line, h.hit.source, h.facts, h.hit.before, h.hit.raw)
               for h in analysis.hits if h.signature.slug == slowrank.TIMEOUT_SLUG]
    if not reports:
        return diagnoses
    reading = slowrank.read(reports, reporting, seen, set(facts.get("silent_ranks", [])))
    confidence = timeout.finding.confidence or 0.0
    out = [d for d in diagnoses if d is not timeout]
    sentences = slowrank.explanation(reading, reporting)
    if reading.low_timeout:
        facts["configured_timeout_s"] = (reading.timeout_ms or 0) / 1000
    if reading.section is not None or reading.rendezvous:
        section = reading.section
        slow_facts: dict[str, Any] = {k: facts[k] for k in ("reporting_ranks", "silent_ranks", "timeout_ms",
                                                            "configured_timeout_s", "op_type", "seq_num")
                                      if k in facts}
        evidence = list(timeout.finding.evidence[:MAX_EVIDENCE - 1])
        if section is not None:
            slow_facts.update(section=section.kind, section_line=section.line)
            if section.rank is not None:
                slow_facts["section_rank"] = section.rank
            evidence.insert(0, Evidence(text=section.text, line=section.line, rank=section.rank))
        slow_confidence = (slowrank.SECTION_CONFIDENCE if section is not None
                           else slowrank.RENDEZVOUS_CONFIDENCE)
        failure = slowrank.failure_class()
        read = Diagnosis(
            finding=Finding(class_=slowrank.SLUG, message=failure.title, severity=Severity.ERROR,
                            fix=Fix(message=slowrank.fix(reading)), evidence=tuple(evidence),
                            facts=slow_facts, confidence=slow_confidence),
            explanation=sentences, knowledge=slowrank.knowledge(),
            signature="long-section" if section is not None else "barrier-like-wait",
            log_line=(log_location(section.source, section.line, section.rank) if section
                      else timeout.log_line))
        guard = next((d for d in out if d.slug == slowrank.SLUG), None)
        out = [d for d in out if d is not guard]
        out.append(read if guard is None else _joined(guard, read))
        confidence = min(confidence, slowrank.UNCERTAIN_TIMEOUT if section is None else 0.55)
    if reading.single_report:
        confidence = min(confidence, slowrank.UNCERTAIN_TIMEOUT)
    explanation = [*timeout.explanation, *(s for s in sentences[-2:] if "s, far below" in s)]
    diverged = slowrank.positions_sentence(reading)
    if diverged:
        explanation.insert(0, diverged)
        facts["outlier_ranks"] = list(reading.outliers)
    revised = replace(timeout.finding, confidence=round(confidence, 2), facts=facts)
    out.append(replace(timeout, finding=revised, explanation=explanation))
    return sorted(out, key=lambda d: (-(d.finding.confidence or 0.0), first_evidence_line(d)))


def _joined(guard: Diagnosis, read: Diagnosis) -> Diagnosis:
    """One `single-rank-long-section` from the guard's own report (`ddpdoctor run`, it measured the section)
    and the same class read from the log's progress and timeout lines: the guard's report leads, the log's
    reading adds the facts and the evidence the report lacks."""
    facts = {**read.finding.facts, **guard.finding.facts}
    known = guard.finding.evidence
    evidence = [*known, *(e for e in read.finding.evidence if e not in known)]
    finding = replace(guard.finding, facts=facts, evidence=tuple(evidence[:MAX_EVIDENCE]),
                      confidence=max(guard.finding.confidence or 0.0, read.finding.confidence or 0.0))
    explanation = [*guard.explanation, *(s for s in read.explanation if s not in guard.explanation)]
    return replace(guard, finding=finding, explanation=explanation)


def explain_logs(sources: list[LogSource], kb: KnowledgeBase, block_size: int = BLOCK_SIZE) -> Explanation:
    analysis = Analysis(kb)
    for source in sources:
        analysis.read(source, block_size)
    diagnoses = _with_slow_rank(analysis, _with_first_error(analysis, analysis.diagnoses()))
    diagnoses = with_sharded_steps(analysis, diagnoses)  # FSDP's hidden collectives (sharded.py)
    kind, end = LogKind.DIAGNOSED, None
    if not diagnoses:
        end = analysis.job_end()
        if end is None:
            blank = all(not line.strip() for tail in analysis.stats.tails for line in tail.lines)
            kind = LogKind.EMPTY if blank and analysis.stats.lines <= PRE else LogKind.NOT_DISTRIBUTED
        elif end.ending is stopped.Ending.FINISHED:
            kind = LogKind.FINISHED
        else:
            diagnoses = [analysis.stopped_diagnosis(end)]
    return Explanation(
        diagnoses=diagnoses,
        stats=analysis.stats,
        looked_for=kb.looked_for(),
        sources=analysis.sources,
        kind=kind,
        job_end=end,
    )
