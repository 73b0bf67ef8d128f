"""Rank tests that balance one another across a whole function: every class of ranks the tests tell apart
makes the same collectives.

    if dist.is_initialized():
        if not is_main():
            dist.barrier()        # the others wait for the main process
        if not is_local_main():
            dist.barrier()        # and for their node's first process
    yield
    if dist.is_initialized():
        if is_main():
            dist.barrier()        # the main process releases them
        if is_local_main():
            dist.barrier()        # each node's first process too

Each rank makes two barriers whatever it is. The distinct rank tests of the function (a test and its
negation are one; two tests of other values, `is_main()` and `is_local_main()`, are two) split the ranks
into classes, one per way to decide them all; the function is walked once per class with its tests
decided (`CollectiveFunctions.paths`). When every class can make exactly the same sequences of collectives
(the uniform tests, `dist.is_initialized()`, still open either way; one made twice decided alike both
times), no rank waits alone: the tests guard nothing. A class no rank is in (the main process that is not
its node's first) is walked too: it can only make the answer stricter.
"""

from __future__ import annotations

import ast
from itertools import product

from .rank_pairs import WalkPaths, _operands
from .rank_sets import RankTest
from .ranks import RankNames
from .source import child_nodes

MAX_TESTS = 4  # 16 walks of the function at most


def balanced_classes(func: ast.FunctionDef | ast.AsyncFunctionDef, names: RankNames, paths: WalkPaths,
                     cls: ast.ClassDef | None) -> set[int]:
    """ids of the rank-test `if`s of `func` that guard nothing this way (empty when it does not hold)."""
    tests: list[tuple[frozenset[str], RankTest]] = []
    ifs: list[ast.If] = []
    others: dict[str, int] = {}  # the other tests, by text: how often each is made
    assigned: set[str] = set()
    stack: list[ast.AST] = list(func.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            assigned.add(node.id)
        if isinstance(node, ast.If) and (test := names.test(node.test)).is_rank_test:
            ifs.append(node)
            key = _operands(node.test)
            if not any(k == key and t in (test, test.negated()) for k, t in tests):
                tests.append((key, test))
        elif isinstance(node, ast.If):
            text = ast.dump(node.test)
            others[text] = others.get(text, 0) + 1
        stack.extend(child_nodes(node))
    if len(tests) < 2 or len(tests) > MAX_TESTS:
        return set()  # one test alone is the sibling pairing's (guards.RankFlow._pair_complementary)
    if any(isinstance(n, (ast.Continue, ast.Break, ast.Return, ast.Raise))
           for node in ifs for n in ast.walk(node)):
        return set()  # ranks that leave under a test: the walk does not follow exits (exits.py does)
    # A test of the same value on every rank, made twice (`if is_dist():` before and after the `yield`),
    # is decided the same way both times in one run (unless the function assigns what it reads).
    repeated = [text for text, count in others.items() if count > 1 and not any(
        f"id='{name}'" in text for name in assigned)][:MAX_TESTS]

    def deciding(values: tuple[bool, ...], uniform: tuple[bool, ...]):  # type: ignore[no-untyped-def]
        def decide(test: ast.expr) -> bool | None:
            key, found = _operands(test), names.test(test)
            for (k, t), value in zip(tests, values, strict=True):
                if k == key and found == t:
                    return value
                if k == key and found == t.negated():
                    return not value
            text = ast.dump(test)
            return next((v for r, v in zip(repeated, uniform, strict=True) if r == text), None)
        return decide

    collectives = False
    for uniform in product((True, False), repeat=len(repeated)):
        seen: set[frozenset[tuple[str, ...]]] = set()
        for values in product((True, False), repeat=len(tests)):
            walked = paths(func.body, cls, deciding(values, uniform))
            if walked is None:
                return set()
            seen.add(frozenset(walked))
            if len(seen) > 1:
                return set()
        collectives = collectives or any(any(p) for p in next(iter(seen)))
    if not collectives:
        return set()  # no collective at all: nothing to balance
    return {id(node) for node in ifs}
