"""The last word of a guarded job that failed: ddpdoctor's verdict in one line, printed by `ddpdoctor run`
after the launcher has exited, so that it follows everything the launcher printed (torchrun's error block
ends with a "Root Cause" that names the first rank it saw exit, which may be a rank ddpdoctor stopped after
the verdict). A second line says so when the job had other ranks.

`ddpdoctor explain` reads the first line back (explain/launcher.py, `read_guard_verdict`): its format is
findings.VERDICT_LINE."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from ...findings import VERDICT_PREFIX, Finding, Severity


@dataclass(frozen=True)
class Recap:
    slug: str  # the class of the job's failure
    rank: int | None  # the rank the verdict names first (the culprit), when it names one
    where: str | None  # its file:line
    report: str | None  # report.json, when --report was given
    others: tuple[int, ...]  # the job's other ranks: stopped after the verdict, not its cause


def recap_of(findings: list[Finding], ranks: Iterable[int], report: str | None) -> Recap | None:
    """The recap of a job whose findings hold an error (the job's failure), else None."""
    failure = next((f for f in findings if f.severity is Severity.ERROR), None)
    if failure is None:
        return None
    located = next((loc for loc in failure.locations if loc.rank is not None), None)
    if located is None:
        located = failure.locations[0] if failure.locations else None
    rank = located.rank if located is not None else None
    where = None
    if located is not None and located.line is not None:
        where = f"{_shown_path(located.path)}:{located.line}"
    others = tuple(sorted(r for r in set(ranks) if r != rank)) if rank is not None else ()
    return Recap(failure.class_, rank, where, report, others)


def _shown_path(path: str) -> str:
    """Relative to the current directory when under it (what a user types), else as it is."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def recap_lines(recap: Recap, torchrun: bool) -> list[str]:
    subject = f"rank {recap.rank}" if recap.rank is not None else "the job"
    place = f" at {recap.where}" if recap.where else ""
    report = f"report: {recap.report}" if recap.report else "add --report DIR to keep a report"
    lines = [f"{VERDICT_PREFIX} {subject}{place}, {recap.slug} ({report})"]
    if torchrun and recap.rank is not None and recap.others:
        named = f"rank {recap.others[0]}" if len(recap.others) == 1 else f"a rank other than {recap.rank}"
        lines.append(
            f'[ddpdoctor] torchrun\'s "Root Cause" above is the first rank it saw exit: if it names {named}, '
            f"that rank was stopped after rank {recap.rank}'s failure and did not cause it"
        )
    return lines
