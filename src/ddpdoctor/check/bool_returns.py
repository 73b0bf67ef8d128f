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
from collections.abc import Callable
from typing import TYPE_CHECKING

from .rank_sets import DISTRIBUTED, RankSet, RankTest
from .rank_sources import LAUNCHER_VARIABLES
from .ranks import ALL, SOME, RankNames, meet

if TYPE_CHECKING:
    from .facts import Target


def true_ranks(func: ast.FunctionDef | ast.AsyncFunctionDef, names: RankNames) -> RankTest | None:
    found: list[RankSet] = []
    ok, _ = _walk(func.body, ALL, names, found)
    if not ok or not found:
        return None
    if not all(ranks == found[0] for ranks in found) or not found[0].restricted:
        return None
    return RankTest(found[0], SOME)


def gated_by(func: ast.FunctionDef | ast.AsyncFunctionDef, callee: Callable[[ast.expr], Target | None]
             ) -> Target | None:
    """`if not super()._do_save(): return False` ... `return True`: the project function (resolved by
    `callee`) whose `False` every path to the one `return True` passes; the other tests' `return False`
    only take ranks away. None unless the body is exactly that."""
    *gates, last = func.body or [ast.Pass()]
    if not _returns_constant([last], True):
        return None
    found: list[Target] = []
    for stmt in gates:
        if isinstance(stmt, ast.If):
            if stmt.orelse or not _returns_constant(stmt.body, False):
                return None
            test = stmt.test
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(
                    test.operand, ast.Call) and (target := callee(test.operand.func)) is not None:
                found.append(target)
        elif any(isinstance(n, ast.Return) for n in ast.walk(stmt)):
            return None
    return found[0] if len(found) == 1 else None


def _returns_constant(body: list[ast.stmt], value: bool) -> bool:
    last = body[-1] if body else None
    return isinstance(last, ast.Return) and isinstance(last.value, ast.Constant) and last.value.value is value


def _launched(test: ast.expr) -> bool:
    """`"RANK" in os.environ`: set by every launcher, absent in a plain run."""
    return isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.In) and (
        isinstance(test.left, ast.Constant) and test.left.value in LAUNCHER_VARIABLES
        and ast.unparse(test.comparators[0]).endswith("environ"))


def _walk(stmts: list[ast.stmt], ranks: RankSet, names: RankNames, found: list[RankSet]
          ) -> tuple[bool, RankSet | None]:
    """Record the ranks reaching each `return True`; (False, _) where the walk cannot tell, else the ranks
    that go on past the block (None: every path returned)."""
    for stmt in stmts:
        if isinstance(stmt, ast.Return):
            if not (isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, bool)):
                return False, None
            if stmt.value.value:
                found.append(ranks)
            return True, None
        if isinstance(stmt, ast.If):
            test = DISTRIBUTED if _launched(stmt.test) else names.test(stmt.test)
            if test == DISTRIBUTED:
                return _walk(stmt.body, ranks, names, found)  # what follows is the plain run's
            if test == DISTRIBUTED.negated():
                ok, after = _walk(stmt.orelse, ranks, names, found)
                if not ok or after is None:
                    return ok, None
                ranks = after
                continue
            then, orelse = (meet(ranks, test.then), meet(ranks, test.orelse)) if test.is_rank_test else (
                ranks, ranks)
            (ok, body), (ok_else, other) = _walk(stmt.body, then, names, found), _walk(
                stmt.orelse, orelse, names, found)
            if not (ok and ok_else):
                return False, None
            if body is None and other is None:
                return True, None
            if test.is_rank_test:
                if body is None or other is None:
                    ranks = body or other or ranks  # the ranks of the side that goes on
            elif body is None or other is None:
                if not _returns_constant(stmt.body if body is None else stmt.orelse, False):
                    return False, None  # which ranks go on depends on a value the walk does not know
                # (a `return False` under any test only takes ranks away from the answer)
                ranks = body or other or ranks
            elif body != other:
                # `if config.distributed: if rank != 0: return False`: the side that picks ranks is the
                # distributed configuration's, the other a single process's (a may-answer, as a returned
                # test beside a uniform one in summaries.returned_ranks)
                if body != ranks and other != ranks:
                    return False, None
                ranks = body if body != ranks else other
            else:
                ranks = body
        elif any(isinstance(n, ast.Return) for n in ast.walk(stmt)):
            return False, None  # a return inside a loop, `with` or `try`: not followed
    return True, ranks
