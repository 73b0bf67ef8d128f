"""What the launcher says about how each rank ended: torchrun's ChildFailedError summary, its agent's
`failed (exitcode: ...)` line, and `torch.multiprocessing.spawn`'s `process N terminated with ...`.

These are structure, not failure patterns: they tell which rank failed first and how (exit code, signal),
which every diagnosis reports and which decides culprit and victims.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass, field

from ..findings import VERDICT_LINE

PATTERNS = (
    re.compile(r"exitcode\s*:\s*(?P<exitcode>-?\d+) \(pid: (?P<pid>\d+)\)"),
    re.compile(
        r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<local_rank>\d+) \(pid: (?P<pid>\d+)\)"
    ),
    re.compile(
        r"rocess (?P<process>\d+) terminated with (?:signal (?P<signal>SIG[A-Z]+)|exit code "
        r"(?P<exitcode>-?\d+))"
    ),
    VERDICT_LINE,  # `ddpdoctor run`'s verdict line, after the launcher's own summary
)
# How many ranks the job had, as launchers and backends print it.
WORLD_SIZE = re.compile(
    r"MEMBER: \d+/(?P<a>\d+)|Starting with (?P<b>\d+) processes|nranks (?P<c>\d+)\b|"
    r"world_size=(?P<d>\d+)|WORLD_SIZE[=:]\s*(?P<e>\d+)"
)
_RANK_FIELD = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank")
_SIGNAL_NAME = re.compile(r"\((SIG[A-Z]+)\)|Signal \d+ \((SIG[A-Z]+)\)")
_ROOT_HEADER = "Root Cause (first observed failure)"
_FAILURES_HEADER = "Failures:"


def signal_name(exitcode: int) -> str | None:
    """torchrun reports death by signal N as exit code -N."""
    if exitcode >= 0:
        return None
    try:
        return _signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


@dataclass(frozen=True)
class RankExit:
    rank: int | None
    exitcode: int | None
    signal: str | None
    root_cause: bool  # listed under torchrun's "Root Cause (first observed failure)"
    line: int
    source: str
    # named by `ddpdoctor run`'s verdict line: the job's failure, whatever torchrun's summary says
    guard_verdict: bool = False

    @property
    def killed_by_launcher(self) -> bool:
        # torchrun sends SIGTERM to the surviving ranks once one has failed: those are not culprits.
        return self.signal == "SIGTERM"


def world_size(text: str) -> int | None:
    match = WORLD_SIZE.search(text)
    if not match:
        return None
    value = int(next(v for v in match.groups() if v is not None))
    return value if 0 < value <= 1 << 16 else None


@dataclass
class LauncherReport:
    exits: list[RankExit] = field(default_factory=list)
    world_size: int | None = None

    def add(self, exit_: RankExit) -> None:
        if exit_.guard_verdict:  # kept beside what the launcher said of the same rank
            self.exits.append(exit_)
            return
        for i, known in enumerate(self.exits):
            if known.guard_verdict:
                continue
            if known.rank == exit_.rank and known.rank is not None:
                # the summary block is more precise than the agent's one-line "failed" message
                if exit_.root_cause or (exit_.signal and not known.signal):
                    self.exits[i] = exit_
                return
        self.exits.append(exit_)

    @property
    def first_failure(self) -> RankExit | None:
        verdicts = [e for e in self.exits if e.guard_verdict]
        if verdicts:
            return verdicts[-1]
        roots = [e for e in self.exits if e.root_cause]
        if roots:
            return roots[0]
        failed = [e for e in self.exits if e.exitcode != 0 and not e.killed_by_launcher]
        return failed[0] if failed else None

    @property
    def ranks(self) -> set[int]:
        return {e.rank for e in self.exits if e.rank is not None}

    def signal_deaths(self) -> list[RankExit]:
        return [e for e in self.exits if e.signal and not e.killed_by_launcher]

    def facts(self) -> dict[str, object]:
        first = self.first_failure
        if first is None:
            return {}
        facts: dict[str, object] = {}
        if first.rank is not None:
            facts["first_failed_rank"] = first.rank
        if first.exitcode is not None:
            facts["exitcode"] = first.exitcode
        if first.signal:
            facts["signal"] = first.signal
        return facts


def read_guard_verdict(text: str, line: int, source: str) -> RankExit | None:
    """The rank `ddpdoctor run`'s verdict line names (guard/launch/recap.py), or None. The guard stopped the
    other ranks after it, so torchrun's "Root Cause" may name one of them instead."""
    match = VERDICT_LINE.search(text)
    if match is None or match.group("rank") is None:
        return None
    return RankExit(int(match.group("rank")), None, None, False, line, source, guard_verdict=True)


def read_exit(text: str, before: list[str], after: list[str], line: int, source: str) -> RankExit | None:
    """A RankExit from a line that matched one of PATTERNS (and its surroundings), or None."""
    verdict = read_guard_verdict(text, line, source)
    if verdict is not None:
        return verdict
    for pattern in PATTERNS:
        if pattern is VERDICT_LINE:
            continue
        match = pattern.search(text)
        if not match:
            continue
        groups = match.groupdict()
        exitcode = int(groups["exitcode"]) if groups.get("exitcode") else None
        sig = groups.get("signal") or (signal_name(exitcode) if exitcode is not None else None)
        if pattern is PATTERNS[0]:
            rank = None
            root = False
            for previous in reversed(before[-8:]):
                field_match = _RANK_FIELD.match(previous)
                if field_match and rank is None:
                    rank = int(field_match.group(1))
                if _ROOT_HEADER in previous:
                    root = True
                    break
                if _FAILURES_HEADER in previous or previous.startswith(("----", "====")):
                    break
            named = _SIGNAL_NAME.search(text) or next(
                (m for m in (_SIGNAL_NAME.search(a) for a in after[:3]) if m), None
            )
            if named:
                sig = named.group(1) or named.group(2)
            return RankExit(rank, exitcode, sig, root, line, source)
        if pattern is PATTERNS[1]:
            return RankExit(int(groups["local_rank"]), exitcode, sig, False, line, source)
        return RankExit(int(groups["process"]), exitcode, sig, False, line, source)
    return None
