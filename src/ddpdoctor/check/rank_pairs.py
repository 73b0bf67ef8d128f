"""The "main process first" idiom when its second half is not a sibling `if`: a rank test whose collectives
the other ranks make later in the same block, inside other branches.

    if dist.get_rank() != 0:
        dist.barrier()            # the others wait for rank 0
    if os.path.exists(cache):
        data = load(cache)
        if dist.get_rank() == 0:
            dist.barrier()        # rank 0 releases them (the cache was there)
    else:
        assert dist.get_rank() == 0
        data = build(); save(data, cache)
        dist.barrier()            # rank 0 releases them (it built the cache)

Over the rest of the block, each side of the first test is walked with that test decided: a later test of
the same ranks (the same `RankTest`, or its negation) takes one side, and an `assert` the side fails ends
the path. When the ranks that took the first `if` (with its collectives) and those that skipped it make
the same one sequence of collectives on every path, each rank makes each call once: the first `if` and the
later tests decided this way guard nothing. Tests of other ranks (`local_rank == 0` against
`rank != 0`), or a first test whose sides are not sharp (`rank < 4`), are not decided.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from .rank_sets import Ranks, RankTest
from .ranks import RankNames

Paths = frozenset[tuple[str, ...]]
WalkPaths = Callable[[list[ast.stmt], "ast.ClassDef | None", "Callable[[ast.expr], bool | None] | None"],
                     "Paths | None"]
END = "<end>"  # (collective_functions.END: a path that returned)
SHARP = (Ranks.RANK_ZERO, Ranks.ONE_RANK, Ranks.ONE_PER_NODE)  # a side that is one process (per node)


def paired_across(stmts: list[ast.stmt], names: RankNames, paths: WalkPaths,
                  cls: ast.ClassDef | None) -> set[int]:
    """ids of the `if`s of `stmts` (and of the tests below them) that pair up this way."""
    paired: set[int] = set()
    for i, stmt in enumerate(stmts):
        if not isinstance(stmt, ast.If) or stmt.orelse or i + 1 == len(stmts):
            continue
        test = names.test(stmt.test)
        if not (test.then.kind in SHARP or test.orelse.kind in SHARP):
            continue
        own = paths(stmt.body, cls, None)
        if not own or not any(p and p != (END,) for p in own):
            continue
        rest = stmts[i + 1:]
        took = paths(rest, cls, _deciding(names, stmt.test, test, True))
        skipped = paths(rest, cls, _deciding(names, stmt.test, test, False))
        if took is None or skipped is None:
            continue
        through = {a if a[-1:] == (END,) else a + b for a in own for b in took}
        if len(through) == 1 and through == set(skipped):
            paired.add(id(stmt))
            decide = _deciding(names, stmt.test, test, True)
            paired.update(id(node) for later in rest for node in ast.walk(later)
                          if isinstance(node, ast.If) and decide(node.test) is not None)
    return paired


def _deciding(names: RankNames, first_test: ast.expr, first: RankTest, took: bool
              ) -> Callable[[ast.expr], bool | None]:
    """A test's value for the ranks that took (or skipped) `first`: known for `first` and its negation."""

    operands = _operands(first_test)

    def decide(test: ast.expr) -> bool | None:
        if _operands(test) != operands:
            return None  # another value (`rank` against `dist.get_rank()`): not known to be the same
        found = names.test(test)
        if found == first:
            return took
        if found == first.negated():
            return not took
        return None

    return decide


def _operands(test: ast.expr) -> frozenset[str]:
    """The names and attributes a test reads (`dist.get_rank() != 0`: dist, get_rank)."""
    return frozenset(node.id if isinstance(node, ast.Name) else node.attr for node in ast.walk(test)
                     if isinstance(node, (ast.Name, ast.Attribute)))
