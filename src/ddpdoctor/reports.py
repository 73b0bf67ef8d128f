"""What a command reports and a renderer is given: the Findings of one command, and the little context a
format needs besides. Here, beside `findings.py`, not in `render/`: the commands, `explain/` and the guard
make these values, and `render/` only reads them.

One type per kind of report. A renderer that needs only the Findings (json, sarif, github) takes any of
them; a layout made for one kind (the check's ruff-like text, the guard's panels, explain's diagnoses, a
recorded run's timelines) takes its own. The registry (`render/registry.py`) maps a format name and a
report type to the function that renders it, so each command offers exactly the formats that exist for its
report.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .findings import Finding

if TYPE_CHECKING:
    from .recording import RunRecording


@dataclass(frozen=True)
class CheckReport:
    """`ddpdoctor check`: findings in source files."""

    findings: tuple[Finding, ...]
    fixed: int = 0  # findings `--fix` fixed (no longer among `findings`)
    unsafe_fixes: bool = False  # `--unsafe-fixes` was given: the summary does not offer them again
    summary: bool = True  # the text format ends with a count ("Found 3 findings.")


@dataclass(frozen=True)
class GuardReport:
    """What the guard prints for a job while it runs (`ddpdoctor run`, `install()`)."""

    findings: tuple[Finding, ...]


@dataclass(frozen=True)
class RecordingReport:
    """`ddpdoctor report DIR`: what a guarded run recorded (its findings and each rank's last collectives)."""

    recording: RunRecording

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(self.recording.findings)


class LogKind(enum.Enum):
    """What a log is when no failure is diagnosed in it: what `explain` says in one line."""

    DIAGNOSED = "diagnosed"
    EMPTY = "empty"  # no text at all (or only blank lines)
    NOT_DISTRIBUTED = "not-distributed"  # nothing from a launcher, a rank or torch.distributed
    FINISHED = "finished"  # a distributed job that ended normally
    UNRECOGNISED = "unrecognised"


# Facts of an explain finding that its renderers show in places of their own (the rest are listed as facts)
REPORT_FACTS = ("signature", "refinements", "what_happened", "other_fixes")


@dataclass(frozen=True)
class LogLine:
    line: int  # 1-based, in its log
    text: str


@dataclass(frozen=True)
class ExplainReport:
    """`ddpdoctor explain`: one Finding per diagnosis (best first; see `explain/report.py` for its facts),
    and what was read."""

    findings: tuple[Finding, ...]
    sources: tuple[str, ...]  # the logs, as named on the command line (`<stdin>`)
    lines_read: int
    kind: LogKind  # what the logs are when nothing was diagnosed
    launchers: tuple[str, ...] = ()  # what the logs show started the job
    finished_at: LogLine | None = None  # the line that shows the job ended normally
    looked_for: tuple[str, ...] = ()  # one line per class: what was searched for
    verbose: bool = False  # when nothing was diagnosed: say what was looked for


Report = CheckReport | GuardReport | RecordingReport | ExplainReport
