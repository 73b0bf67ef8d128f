"""Conditional expressions in the rank domain: `a if cond else b` as a rank test or as a rank value.

`RankNames` hands its `IfExp` nodes here. A choice between two values whose condition is no rank test
(`get_pg_rank(pp) == 0 if pp is not None else mpu.is_pipeline_first_stage()`: whether a group was passed)
is taken the same way by every process of a run, so the ranks that pass it are those of one branch or the
other: their join (never fewer writers than either). A condition that is a rank test itself splits the
processes: `(cond and a) or (not cond and b)`. A value chosen so holds the rank role its branches share.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from .rank_sets import UNIFORM, RankTest, Role, join, meet
from .rank_sources import _int_constant, _nothing

if TYPE_CHECKING:
    from .ranks import RankNames


def choice_test(names: RankNames, test: ast.IfExp) -> RankTest:
    """Who takes each branch of `if (a if cond else b):`."""
    # `Stopper() if rank == 0 else None`: an object on the ranks the test picks, nothing elsewhere; so
    # `if stopper:` (and `stopper is not None`) picks those ranks
    if _nothing(test.orelse) and not _nothing(test.body):
        return names.test(test.test)
    if _nothing(test.body) and not _nothing(test.orelse):
        return names.test(test.test).negated()
    body, orelse = names.test(test.body), names.test(test.orelse)
    if not (body.is_rank_test or orelse.is_rank_test):
        return UNIFORM
    cond = names.test(test.test)
    if not cond.is_rank_test:  # every process takes the same branch: one branch's ranks or the other's
        return RankTest(join(body.then, orelse.then), join(body.orelse, orelse.orelse))
    return RankTest(join(meet(cond.then, body.then), meet(cond.orelse, orelse.then)),
                    join(meet(cond.then, body.orelse), meet(cond.orelse, orelse.orelse)))


def choice_role(names: RankNames, node: ast.IfExp) -> Role | None:
    """What `a if cond else b` counts: the role both branches hold (`get_pg_rank(dp) if dp is not None
    else mpu.get_data_parallel_rank()`), or one branch's where the other is the constant of a run that is
    not distributed (`dist.get_rank() if dist.is_initialized() else 0`)."""
    body, orelse = names.role(node.body), names.role(node.orelse)
    if body is None and _unlaunched(node.body):
        return orelse
    if orelse is None and _unlaunched(node.orelse):
        return body
    return body if body == orelse else None


def _unlaunched(node: ast.expr) -> bool:
    """`0` or `-1`: the rank a process has outside a distributed run."""
    return _int_constant(node) in (0, -1)
