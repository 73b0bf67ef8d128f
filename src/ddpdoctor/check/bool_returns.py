"""A function that answers a rank test with `return True` / `return False` under its own tests:

    def is_main():
        if "RANK" in os.environ:                 # a launched run
            if int(os.environ["RANK"]) == 0:
                return True
            return False
        return True                              # a plain run: the one process

`true_ranks(func, names)` walks the body keeping the ranks that reach each statement; a test of whether
the run is distributed (`"RANK" in os.environ`, `dist.is_initialized()`) takes its distributed side. When
every `return True` is reached by the same restricted ranks, the function is that rank test
(summaries.returned_ranks). Any other return, or `return True` on different ranks, gives None.
"""

from __future__ import annotations

import ast

from .rank_sets import DISTRIBUTED, RankSet, RankTest
from .rank_sources import LAUNCHER_VARIABLES
from .ranks import ALL, SOME, RankNames, meet


def true_ranks(func: ast.FunctionDef | ast.AsyncFunctionDef, names: RankNames) -> RankTest | None:
    found: list[RankSet] = []
    if not _walk(func.body, ALL, names, found) or not found:
        return None
    if not all(ranks == found[0] for ranks in found) or not found[0].restricted:
        return None
    return RankTest(found[0], SOME)


def _launched(test: ast.expr) -> bool:
    """`"RANK" in os.environ`: set by every launcher, absent in a plain run."""
    return isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.In) and (
        isinstance(test.left, ast.Constant) and test.left.value in LAUNCHER_VARIABLES
        and ast.unparse(test.comparators[0]).endswith("environ"))


def _walk(stmts: list[ast.stmt], ranks: RankSet, names: RankNames, found: list[RankSet]) -> bool:
    """Record the ranks reaching each `return True`; False where the walk cannot tell (False: stop)."""
    for stmt in stmts:
        if isinstance(stmt, ast.Return):
            if not (isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, bool)):
                return False
            if stmt.value.value:
                found.append(ranks)
            return True
        if isinstance(stmt, ast.If):
            test = DISTRIBUTED if _launched(stmt.test) else names.test(stmt.test)
            if test == DISTRIBUTED:
                return _walk(stmt.body, ranks, names, found)  # what follows is the plain run's
            if test == DISTRIBUTED.negated():
                if not _walk(stmt.orelse, ranks, names, found):
                    return False
                continue
            then, orelse = (meet(ranks, test.then), meet(ranks, test.orelse)) if test.is_rank_test else (
                ranks, ranks)
            if not (_walk(stmt.body, then, names, found) and _walk(stmt.orelse, orelse, names, found)):
                return False
            ends = stmt.body and isinstance(stmt.body[-1], ast.Return)
            if ends and stmt.orelse and isinstance(stmt.orelse[-1], ast.Return):
                return True
            if ends and test.is_rank_test:
                ranks = orelse
            elif ends or stmt.orelse and isinstance(stmt.orelse[-1], ast.Return):
                return False  # which ranks go on depends on a value the walk does not know
        elif any(isinstance(n, ast.Return) for n in ast.walk(stmt)):
            return False  # a return inside a loop, `with` or `try`: not followed
    return True
