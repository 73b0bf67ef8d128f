"""What `explain` decides, as values: the signatures found on a line, the diagnoses made of them, what a log
is when none is made; and the text helpers that fill a class's templates from a diagnosis's facts."""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..collectives import by_op_type
from ..findings import Finding, Location
from ..render.ranges import compact
from ..reports import LogKind
from . import stopped
from .knowledge import ClassKnowledge, Refinement, Signature
from .scanner import RawHit, ScanStats
from .source import LogSource


@dataclass
class SignatureHit:
    signature: Signature
    hit: RawHit
    rank: int | None
    text: str
    facts: dict[str, Any]
    score: float
    refinements: list[Refinement]
    order: int
    consequence: bool = False  # a root signature on a rank that had already reported another failure

    @property
    def role(self) -> str:
        return "victim" if self.consequence else self.signature.role


@dataclass
class Diagnosis:
    """One failure class found in the log: the Finding plus the explanation written for this log."""

    finding: Finding
    explanation: list[str]  # log-specific sentences, most specific first
    knowledge: ClassKnowledge
    # the fixes after the finding's own, when the class's general ones do not fit (a log with no error in it)
    other_fixes: tuple[str, ...] | None = None
    signature: str = ""  # the id of the signature that decided it ("" for a log that stops with no error)
    refinements: tuple[str, ...] = ()  # the ids of the refinements that applied, in order
    log_line: Location | None = None  # the line of the log that decided it (not for stdin: it is no file)

    @property
    def slug(self) -> str:
        return self.finding.class_


@dataclass
class Explanation:
    diagnoses: list[Diagnosis]
    stats: ScanStats
    looked_for: list[str]
    sources: list[str] = field(default_factory=list)
    kind: LogKind = LogKind.DIAGNOSED
    job_end: stopped.JobEnd | None = None  # how a distributed job's log ends, when no failure explains it


class _Facts(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> Any:
        raise KeyError(key)


# Facts holding a c10d `OpType` name (`ALLREDUCE`, `_ALLGATHER_BASE`), and the fact that names its call.
_OP_TYPE_FACTS = {"op_type": "op_call", "op_a": "op_a_call", "op_b": "op_b_call"}


def op_calls(facts: Mapping[str, Any]) -> dict[str, str]:
    """The Python call behind each OpType a log printed (`_ALLGATHER_BASE` → `dist.all_gather_into_tensor`),
    from the shared table of collectives: the first public op that prints it."""
    found = {}
    for fact, call_fact in _OP_TYPE_FACTS.items():
        value = facts.get(fact)
        if not isinstance(value, str):
            continue
        ops = [op for op in by_op_type(value) if not op.name.startswith("_")]
        if ops:
            found[call_fact] = f"dist.{ops[0].name}"
    return found


def fill(template: str, facts: Mapping[str, Any]) -> str | None:
    """The template with facts filled in, or None when a fact it needs is missing."""
    if not template:
        return None
    values = _Facts({k: compact(v) if isinstance(v, (list, tuple)) else v for k, v in facts.items()})
    try:
        return string.Formatter().vformat(template, (), values)
    except (KeyError, IndexError, ValueError):
        return None

def log_location(source: str, line: int, rank: int | None) -> Location | None:
    return None if source == LogSource("-").label else Location(path=source, line=line, rank=rank)


def first_evidence_line(diagnosis: Diagnosis) -> int:
    lines = [e.line for e in diagnosis.finding.evidence if e.line is not None]
    return min(lines) if lines else 0
