"""Whether a waiting rank got to its collective through a rank-conditional branch, read from its stack's
source on disk with the static checker's own rank analysis (`check/ranks.py`).

A rank waiting in `barrier` while its peer runs DDP's backward is either one step behind (uneven batches)
or the only rank that called the barrier (`if rank == 0: save_checkpoint()`); the stack tells them apart
when one of its user frames sits inside an `if` whose test only some ranks take. Called once per verdict,
never per collective; fail-open: a file that is gone or does not parse is no evidence either way.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from ...failsafe import failsafe
from ...records import Frame
from ...render.paths import short_path

if TYPE_CHECKING:
    from ...check.ranks import RankNames

_MAX_SOURCE = 2_000_000  # bytes: a generated file that large is not read at verdict time


@dataclass(frozen=True)
class RankBranch:
    """The `if` a frame's line is under, and who takes the branch that holds it."""

    path: str
    line: int  # the `if`'s line
    test: str  # its test, as written
    ranks: str  # who takes the branch ("global rank 0")

    def describe(self) -> str:
        return f"`if {self.test}:` at {short_path(self.path)}:{self.line}, taken by {self.ranks} only"


def rank_branch(stack: Sequence[Frame]) -> RankBranch | None:
    """The innermost rank-conditional branch on the path of `stack` (innermost frame first): the first user
    frame whose line is inside an `if` only some ranks take. None when no frame is, or none can be read."""
    for frame in stack:
        if frame.library is not None or frame.line <= 0:
            continue
        found = None
        with failsafe("rank_branch: reading a frame's source"):
            found = _branch_at(frame.path, frame.line, _stamp(frame.path))
        if found is not None:
            return found
    return None


def _stamp(path: str) -> float | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime if stat.st_size <= _MAX_SOURCE else None


@lru_cache(maxsize=64)
def _branch_at(path: str, line: int, stamp: float | None) -> RankBranch | None:
    if stamp is None:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        tree = ast.parse(text, filename=path)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    from ...check.ranks import RankNames  # here: the checker is imported only when a verdict needs it

    return _search(tree.body, line, RankNames(tree.body), path, text)


def _contains(stmts: Iterable[ast.stmt], line: int) -> bool:
    return any(s.lineno <= line <= (s.end_lineno or s.lineno) for s in stmts)


def _search(body: list[ast.stmt], line: int, names: RankNames, path: str, text: str) -> RankBranch | None:
    """The innermost rank-conditional `if` around `line` in `body`, scopes nested as the checker nests
    them."""
    from ...check.ranks import RankNames
    for stmt in body:
        if not stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            continue
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return _search(stmt.body, line, RankNames(stmt.body, names), path, text)
        if isinstance(stmt, ast.ClassDef):
            return _search(stmt.body, line, names, path, text)
        inner = None
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(stmt, field, None) or []
            for child in children:
                block = getattr(child, "body", None) if not isinstance(child, ast.stmt) else None
                if block is not None and _contains(block, line):
                    inner = _search(block, line, names, path, text)
            stmts = [c for c in children if isinstance(c, ast.stmt)]
            if stmts and _contains(stmts, line):
                inner = _search(stmts, line, names, path, text)
        if inner is not None:
            return inner
        if isinstance(stmt, ast.If) and stmt.test.lineno != line:
            test = names.test(stmt.test)
            taken = (
                test.then
                if _contains(stmt.body, line)
                else test.orelse
                if _contains(stmt.orelse, line)
                else None
            )
            if taken is not None and taken.restricted:
                source = ast.get_source_segment(text, stmt.test) or ast.unparse(stmt.test)
                return RankBranch(path, stmt.lineno, " ".join(source.split()), taken.kind.value)
        return None
    return None
