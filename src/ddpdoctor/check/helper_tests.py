"""Rank tests through a project helper, settled once the index is whole.

A file's summary is made before the other files are read, so `if utils.is_primary(args):` (a helper of
another module, or of this one, returning `args.rank == 0`) is no rank test yet, and the calls under it
would count as made on every rank: evidence, for the call graph, that a save helper runs everywhere. The
summary records, per call, the project functions its `if` tests call (`helper_tests`); once every file is
in, a call whose test is a rank test through one of them is made under a rank test (`settled`).
"""

from __future__ import annotations

import ast
import dataclasses
from typing import TYPE_CHECKING

from .closure_calls import closures_run
from .facts import HelperTest, ModuleSummary, Passed
from .source import walk

if TYPE_CHECKING:
    from .callgraph import CallGraph
    from .index import Resolver


def helper_tests(resolver: Resolver, ifs: list[ast.If]) -> dict[int, tuple[HelperTest, ...]]:
    """ids of the calls of a file under an `if` whose test calls a project function (`if is_main():`,
    `if not is_main():` for the else-branch, `if is_main() and due:`), each with those helper calls."""
    found: dict[int, tuple[HelperTest, ...]] = {}
    for branch in ifs:
        test, negated = branch.test, False
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, negated = test.operand, True
        operands = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and (
            not negated) else [test]
        helpers = []
        for operand in operands:
            if isinstance(operand, ast.Call) and not any(isinstance(a, ast.Starred) for a in operand.args):
                callee = resolver.callee(operand.func, None)
                if callee is not None and callee[0].name[:1].islower():
                    helpers.append(HelperTest(callee[0], negated, Passed.of(operand)))
        if not helpers:
            continue
        for stmt in branch.orelse if negated else branch.body:
            for node in walk(stmt):
                if isinstance(node, ast.Call):
                    found[id(node)] = (*found.get(id(node), ()), *helpers)
    return found


def settled(graph: CallGraph, module: ModuleSummary) -> ModuleSummary:
    """The module once the index is whole: nested functions passed on made calls (closure_calls.py), and
    calls under a helper's rank test made guarded."""
    if module.passes_closures:
        module = closures_run(graph, module)
    if not module.helper_tested:
        return module
    functions = dict(module.functions)
    for name, summary in module.functions.items():
        if any(not site.guarded and site.helper_tests for site in summary.calls):
            calls = tuple(dataclasses.replace(site, guarded=True) if not site.guarded and any(
                _restricts(graph, test) for test in site.helper_tests) else site for site in summary.calls)
            functions[name] = dataclasses.replace(summary, calls=calls)
    return dataclasses.replace(module, functions=functions, helper_tested=False)


def _restricts(graph: CallGraph, test: HelperTest) -> bool:
    """Whether the branch the call is in runs on some ranks only, by what the helper returns."""
    returned = graph.returned(test.target)
    if returned is None or returned.test is None:
        return False
    if returned.unless_passed is not None and test.passed.may_pass(
            returned.unless_passed):
        return False  # the flag is passed: which branch of the helper it picks is not read
    return (returned.test.orelse if test.negated else returned.test.then).restricted
