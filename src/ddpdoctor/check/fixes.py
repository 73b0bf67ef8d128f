"""Applying fixes: text edits computed from ast positions, written atomically.

Edits replace exact character ranges, so everything around them (formatting, comments, line endings) stays
as it was. Overlapping edits are not applied together: the first wins and the rest wait for the next run,
as in ruff. A file is rewritten by writing a temporary file next to it and `os.replace`-ing it over the
original, so an interrupted run never leaves a half-written file.
"""

from __future__ import annotations

import difflib
import os
import stat
import tempfile
from collections.abc import Iterable

from ..findings import Applicability, Edit, Finding
from .engine import physical_lines


def applicable(finding: Finding, unsafe: bool) -> bool:
    fix = finding.fix
    if fix is None or not fix.edits:
        return False
    return fix.applicability == Applicability.SAFE or unsafe


def apply_edits(text: str, findings: Iterable[Finding], unsafe: bool) -> tuple[str, list[Finding]]:
    """The fixed text and the findings whose fixes went in."""
    lines = physical_lines(text)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(line: int, column: int) -> int:
        return starts[line - 1] + column - 1

    chosen: list[tuple[int, int, str, Finding]] = []
    shared: list[Finding] = []
    for finding in sorted(findings, key=Finding.sort_key):
        if not applicable(finding, unsafe):
            continue
        assert finding.fix is not None
        spans = [
            (offset(e.line, e.column), offset(e.end_line, e.end_column), e.content) for e in finding.fix.edits
        ]
        # An edit that fixes several findings at once (DDP101 moves all the logs of one `if` together) is
        # the same edit in each: the first carries it in, the others are fixed by it.
        taken = {(a, b, content) for a, b, content, _ in chosen}
        if spans and all(span in taken for span in spans):
            shared.append(finding)
            continue
        if any(_overlaps(a, b, c, d) for a, b, _ in spans for c, d, _, _ in chosen):
            continue
        chosen.extend((a, b, content, finding) for a, b, content in spans)
    fixed = text
    for start, end, content, _ in sorted(chosen, key=lambda item: item[0], reverse=True):
        fixed = fixed[:start] + content + fixed[end:]
    applied: list[Finding] = []
    for finding in [*(finding for *_, finding in chosen), *shared]:
        if finding not in applied:
            applied.append(finding)
    return fixed, applied


def _overlaps(a: int, b: int, c: int, d: int) -> bool:
    return a < d and c < b or a == c


def write_atomically(path: str, text: str) -> None:
    target = os.path.realpath(path)  # through a symlink: replace the file it points to, not the link
    directory = os.path.dirname(target)
    mode = stat.S_IMODE(os.stat(target).st_mode)
    with open(target, "rb") as original:
        bom = original.read(3) == b"\xef\xbb\xbf"  # read_source dropped it; put it back
    fd, temp = tempfile.mkstemp(prefix=".ddpdoctor-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8-sig" if bom else "utf-8", newline="") as handle:
            handle.write(text)
        os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def unified_diff(path: str, before: str, after: str) -> str:
    return "".join(difflib.unified_diff(
        physical_lines(before), physical_lines(after), fromfile=f"a/{path}", tofile=f"b/{path}"))


__all__ = ["Edit", "applicable", "apply_edits", "unified_diff", "write_atomically"]
