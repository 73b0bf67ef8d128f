"""The one data model: every detector produces `Finding`s, every renderer consumes them.

The checker, the runtime guard and `explain` all speak this model, so a finding can be printed by any
renderer, serialised to JSON and read back unchanged. The JSON form is documented in docs/json.md;
its keys are stable (`class` and `code` are the public names of the failure class and the rule).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """Larger is more severe; used to sort findings."""
        return {"error": 2, "warning": 1, "info": 0}[self.value]


class Applicability(str, enum.Enum):
    """Whether a machine edit can be applied without review (ruff's convention)."""

    SAFE = "safe"
    UNSAFE = "unsafe"


@dataclass(frozen=True)
class Location:
    """A place in a source file or a log. Lines and columns are 1-based; `rank` is the DDP rank, if known."""

    path: str
    line: int | None = None
    column: int | None = None
    end_line: int | None = None
    end_column: int | None = None
    rank: int | None = None

    def __str__(self) -> str:
        text = self.path
        if self.line is not None:
            text += f":{self.line}"
            if self.column is not None:
                text += f":{self.column}"
        if self.rank is not None:
            text = f"[rank {self.rank}] {text}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "rank": self.rank,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Location:
        return cls(
            path=str(data["path"]),
            line=data.get("line"),
            column=data.get("column"),
            end_line=data.get("end_line"),
            end_column=data.get("end_column"),
            rank=data.get("rank"),
        )


@dataclass(frozen=True)
class Edit:
    """Replace the text between (line, column) and (end_line, end_column) of `path` with `content`.

    Columns are 1-based character offsets; the end is exclusive. An insertion has start == end.
    """

    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    content: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "content": self.content,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Edit:
        return cls(
            path=str(data["path"]),
            line=int(data["line"]),
            column=int(data["column"]),
            end_line=int(data["end_line"]),
            end_column=int(data["end_column"]),
            content=str(data["content"]),
        )


@dataclass(frozen=True)
class Fix:
    """How to fix a finding: always a text for people, optionally edits a tool can apply."""

    message: str
    edits: tuple[Edit, ...] = ()
    applicability: Applicability = Applicability.UNSAFE

    def to_dict(self) -> dict[str, Any]:
        return {
            "message": self.message,
            "applicability": self.applicability.value if self.edits else None,
            "edits": [edit.to_dict() for edit in self.edits],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fix:
        edits = tuple(Edit.from_dict(e) for e in data.get("edits") or ())
        applicability = data.get("applicability") or Applicability.UNSAFE.value
        return cls(message=str(data["message"]), edits=edits, applicability=Applicability(applicability))


@dataclass(frozen=True)
class Evidence:
    """One observed fact backing a finding: a log line, a recorded collective, a stack frame."""

    text: str
    line: int | None = None  # the line number in the log or source it came from
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "line": self.line, "rank": self.rank}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evidence:
        return cls(text=str(data["text"]), line=data.get("line"), rank=data.get("rank"))


@dataclass(frozen=True)
class Finding:
    """One detected problem.

    `class_` is the failure-class slug from the catalogue (`collective-divergence`, ...); `code` the static
    rule that found it (`DDP101`), empty for the guard and `explain`. `locations[0]` is the primary one.
    `facts` holds named values a detector established (ranks, sequence numbers, devices, versions);
    `confidence` (0..1) is set by detectors that rank alternatives, such as `explain`.
    """

    class_: str
    message: str
    severity: Severity = Severity.ERROR
    code: str = ""
    locations: tuple[Location, ...] = ()
    fix: Fix | None = None
    evidence: tuple[Evidence, ...] = ()
    references: tuple[str, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)
    confidence: float | None = None

    @property
    def location(self) -> Location | None:
        return self.locations[0] if self.locations else None

    def sort_key(self) -> tuple[str, int, int, str]:
        loc = self.location
        return (
            loc.path if loc else "",
            (loc.line or 0) if loc else 0,
            (loc.column or 0) if loc else 0,
            self.code,
        )

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON object (docs/json.md).

        The primary location is repeated at the top level (`path`, `line`, ...) so that flat consumers
        (CI annotations, editors) need not look into `locations`.
        """
        primary = self.location
        return {
            "class": self.class_,
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "path": primary.path if primary else None,
            "line": primary.line if primary else None,
            "column": primary.column if primary else None,
            "end_line": primary.end_line if primary else None,
            "end_column": primary.end_column if primary else None,
            "locations": [loc.to_dict() for loc in self.locations],
            "fix": self.fix.to_dict() if self.fix else None,
            "evidence": [ev.to_dict() for ev in self.evidence],
            "references": list(self.references),
            "facts": dict(self.facts),
            "confidence": self.confidence,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        try:
            fix = data.get("fix")
            return cls(
                class_=str(data["class"]),
                code=str(data.get("code") or ""),
                severity=Severity(data.get("severity", "error")),
                message=str(data["message"]),
                locations=tuple(Location.from_dict(loc) for loc in data.get("locations") or ()),
                fix=Fix.from_dict(fix) if fix else None,
                evidence=tuple(Evidence.from_dict(ev) for ev in data.get("evidence") or ()),
                references=tuple(str(r) for r in data.get("references") or ()),
                facts=dict(data.get("facts") or {}),
                confidence=data.get("confidence"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a ddpdoctor finding: {exc}") from exc


def dumps(findings: Iterable[Finding], *, indent: int | None = 2) -> str:
    """Serialise findings as the documented JSON list."""
    return json.dumps([f.to_dict() for f in findings], indent=indent, ensure_ascii=False)


def loads(text: str) -> list[Finding]:
    """Parse the JSON list written by `dumps`."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("expected a JSON list of findings")
    return [Finding.from_dict(item) for item in data]


# The verdict line: the last line `ddpdoctor run` prints after a job that failed (guard/launch/recap.py),
# which `ddpdoctor explain` reads back as the job's first failure (explain/launcher.py). One format for both:
# "[ddpdoctor] verdict: rank 1 at train.py:27, collective-divergence (report: out/report.json)"
VERDICT_PREFIX = "[ddpdoctor] verdict:"
VERDICT_LINE = re.compile(
    re.escape(VERDICT_PREFIX)
    + r" (?:rank (?P<rank>\d+)|the job)(?: at (?P<where>\S+))?, (?P<slug>[a-z0-9-]+)\b"
)
