"""The other end of a cross-file DDP101 finding: a collective that a call of another file makes only some
ranks reach, found from the collective's own file.

    # scores.py                                   # run.py
    class ScoreFile:                              if dist.get_rank() == 0:
        def __init__(self, path, rows):               save_scores("s.npy", scores)   # DDP101 here
            ...
            dist.barrier()     # and here: rank 0 alone waits in it

The finding at the call names the chain down to the barrier; the reader of `scores.py` (and the fix, which
often changes the callee: a `distributed=False` flag) needs it at the barrier too. `rank_only_callers` walks
up the project's callers of each function of the file that issues a collective itself, through calls
outside any rank test, to a call under one in another file; the path down from that call is replayed with
the literals each call fixes (constant_gates.py: a `distributed=False` passed on turns the barrier off), and
the call counts only where DDP101, reading the caller's file with the whole project, reports it (`report`):
balanced branches, trusted guards and whole-group tests are the rule's to judge, once. Calls in the
collective's own file are left to the in-file finding at the call; `init_process_group` is no such end (a
call under a rank test runs after the group exists: setup code skips it or raises, it never waits).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..findings import Finding
from .constant_gates import Binding, gated
from .facts import CallSite, Step, Target
from .scope import MODULE
from .source import SourceFile

if TYPE_CHECKING:
    from .project import ProjectIndex

MAX_DEPTH = 8  # calls between the rank-tested call and the collective's function


@dataclass(frozen=True)
class RankOnlyCaller:
    """A call of another file, reported by DDP101 there, whose chain reaches a collective of this file."""

    collective: Step  # the collective, in the file being checked
    function: Target  # the function of this file that issues it
    call: Step  # the call under the rank test (its file and line)
    finding: Finding  # DDP101's finding at that call

    def message(self) -> str:
        guard_line = self.finding.facts.get("guard_line")
        return (f"{self.collective.what} is a collective that only some ranks reach: {self.call.show()} is "
                f"called under a rank test (line {guard_line}) and leads here through "
                f"`{self.function.name}()`; the other ranks never join it, so the job hangs")

    def facts(self) -> dict[str, object]:
        return {"collective": self.collective.what.strip("`"), "called_at": self.call.show(),
                "guard_line": self.finding.facts.get("guard_line")}


def rank_only_callers(project: ProjectIndex, path: str,
                      report: Callable[[SourceFile], Iterable[Finding]]) -> list[RankOnlyCaller]:
    """For each function of `path` that issues a collective itself: the first call of another file under a
    rank test that reaches it (one per collective line)."""
    module = project.modules.get(path)
    if module is None:
        return []
    found: list[RankOnlyCaller] = []
    for name, summary in module.functions.items():
        if summary.collective is None or summary.collective.path != path or summary.rank_zero_only or (
                _setup(summary.collective)):
            continue
        target = Target(path, name)
        for chain in _upward(project, target):
            caller, site = chain[0]
            reported = [f for f in _reported(project, caller.path, report)
                        if f.location is not None and f.location.line == site.line]
            if reported and _runs_down(project, chain, target):
                call = Step(f"`{site.target.name}()`", caller.path, site.line)
                found.append(RankOnlyCaller(summary.collective, target, call, reported[0]))
                break
    return found


def has_rank_only_callers(project: ProjectIndex, path: str) -> bool:
    """Whether some collective of `path` may be reached from a rank-tested call of another file (the
    summaries alone, no file read: the second pass's question)."""
    module = project.modules.get(path)
    return module is not None and any(
        summary.collective is not None and not summary.rank_zero_only and not _setup(summary.collective)
        and any(True for _ in _upward(project, Target(path, name)))
        for name, summary in module.functions.items())


def _setup(collective: Step) -> bool:
    """Making the default group: a call under a rank test runs once the group exists, where the setup code
    skips it (`if not initialized:`, a shared-state singleton) or raises at once; it never waits."""
    return "init_process_group" in collective.what


Chain = tuple[tuple[Target, CallSite], ...]  # from the rank-tested call down to the collective's function


def _upward(project: ProjectIndex, start: Target) -> Iterable[Chain]:
    """Breadth first up the callers, through calls outside any rank test, to calls under one in another
    file (each caller visited once: a cycle ends)."""
    seen = {start}
    layer: list[tuple[Target, Chain]] = [(start, ())]
    for _ in range(MAX_DEPTH):
        following: list[tuple[Target, Chain]] = []
        for at, below in layer:
            for caller, site in project.callers(at):
                if site.passed_to is not None:
                    continue
                chain = ((caller, site), *below)
                if site.guarded:
                    if caller.path != start.path:
                        yield chain
                    continue
                if caller.name == MODULE or caller in seen:
                    continue
                seen.add(caller)
                following.append((caller, chain))
        layer = following
        if not layer:
            return


def _runs_down(project: ProjectIndex, chain: Chain, target: Target) -> bool:
    """The collective still runs on the way down: no call of the chain is turned off by a literal an
    earlier call fixed, and the function's own collective is not (constant_gates.py)."""
    fixed: Binding = ()
    for index, (_caller, site) in enumerate(chain):
        callee = project.function(site.target)
        if callee is None or callee[1].rank_zero_only:
            return False
        fixed = project.passed(site, fixed)
        quiet, unreached = gated(callee[1], fixed)
        if index + 1 < len(chain):
            if chain[index + 1][1].line in unreached:
                return False
        elif quiet or callee[0] != target:
            return False
    return True


def _reported(project: ProjectIndex, path: str, report: Callable[[SourceFile], Iterable[Finding]]
              ) -> list[Finding]:
    """DDP101's findings in another file of the project, read once per run and process."""
    cache: dict[str, list[Finding]] = project.__dict__.setdefault("_rank_only_reports", {})
    if path not in cache:
        cache[path] = []
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
            cache[path] = list(report(SourceFile(path, text, ast.parse(text), project)))
        except (OSError, SyntaxError, ValueError, RecursionError):
            pass
    return cache[path]
