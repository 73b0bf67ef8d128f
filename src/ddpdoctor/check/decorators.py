"""Decorators read by what their body does, not by their name: a project decorator whose wrapper calls the
decorated function only under a rank test makes that function run on those ranks only.

    def on_main(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if int(os.environ.get("RANK", "0")) == 0:
                return fn(*args, **kwargs)
        return wrapper

    @on_main
    def save_weights(model, path):
        torch.save(model.state_dict(), path)      # one writer: the wrapper runs it on rank 0 only

`rank_gate(func, names)` reads one decorator: its first parameter is called in a nested function that it
returns, and every such call is under a rank test that lets only some ranks through (`if test:`, or after
`if not test: return`); the answer is those ranks. A wrapper that also calls the function elsewhere, or
under a test of its arguments (`if kwargs.get("main", True):`), gives None: it guards nothing. The first
pass keeps the answer on the decorator's summary (`FunctionSummary.rank_gate`), so a decorator imported
from another file is read too (guards.RankFlow asks the index).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from .rank_sets import RankSet, RankTest
from .ranks import ALL, RankNames, meet

if TYPE_CHECKING:
    from .source import SourceFile
    from .summaries import Returned

Function = ast.FunctionDef | ast.AsyncFunctionDef


def rank_gate(func: Function, names: RankNames) -> RankSet | None:
    """The ranks a decorator's wrapper runs the decorated function on, when they are not all of them."""
    params = [*func.args.posonlyargs, *func.args.args]
    if not params:
        return None
    wrapped = params[0].arg
    returned = {stmt.value.id for stmt in func.body
                if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Name)}
    found: list[RankSet] = []
    for wrapper in func.body:
        if isinstance(wrapper, (ast.FunctionDef, ast.AsyncFunctionDef)) and wrapper.name in returned:
            inner = RankNames(wrapper.body, names)
            if not _visit(wrapper.body, ALL, wrapped, inner, found):
                return None
    if not found or not all(ranks.restricted and ranks == found[0] for ranks in found):
        return None
    return found[0]


def _visit(stmts: list[ast.stmt], ranks: RankSet, wrapped: str, names: RankNames,
           found: list[RankSet]) -> bool:
    """Record the ranks of each call of `wrapped` in `stmts`; False where the walk cannot tell."""
    for stmt in stmts:
        if isinstance(stmt, ast.If):
            if _calls(stmt.test, wrapped):
                return False
            test = names.test(stmt.test)
            then, orelse = (meet(ranks, test.then), meet(ranks, test.orelse)) if test.is_rank_test else (
                ranks, ranks)
            if not (_visit(stmt.body, then, wrapped, names, found)
                    and _visit(stmt.orelse, orelse, wrapped, names, found)):
                return False
            if test.is_rank_test and not stmt.orelse and stmt.body and isinstance(
                    stmt.body[-1], ast.Return):
                ranks = orelse  # `if not main: return`: the rest runs on the others only
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        else:
            children = [c for c in ast.iter_child_nodes(stmt) if isinstance(c, ast.stmt)]
            if children:  # `with`, `try`, loops: their bodies under the same ranks
                for field in ("body", "orelse", "finalbody"):
                    if not _visit(getattr(stmt, field, None) or [], ranks, wrapped, names, found):
                        return False
                for handler in getattr(stmt, "handlers", ()):
                    if not _visit(handler.body, ranks, wrapped, names, found):
                        return False
                heads = [c for c in ast.iter_child_nodes(stmt) if isinstance(c, ast.expr)]
                if any(_calls(h, wrapped) for h in heads):
                    return False
            elif _calls(stmt, wrapped):
                found.append(ranks)
    return True


def _calls(node: ast.AST, wrapped: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == wrapped
               for n in ast.walk(node))


def decorator_gate(source: SourceFile, func: Function, names: RankNames) -> tuple[ast.expr, RankSet] | None:
    """The project decorator of `func` that runs it on some ranks only, and those ranks: one of this file
    (read here), or of another (its summary, once the index is whole)."""
    local = source.module_functions
    project = source.project
    for deco in func.decorator_list:
        if isinstance(deco, ast.Name) and deco.id in local:
            gate = rank_gate(local[deco.id], names)
        elif isinstance(deco, (ast.Name, ast.Attribute)) and project is not None and (
                callee := project.resolver(source).callee(deco, None)) is not None and (
                found := project.function(callee[0])) is not None:
            gate = found[1].rank_gate
        else:
            continue
        if gate is not None:
            return deco, gate
    return None


class _SameFile:
    """`ranks.Helpers` from the file's own functions that return a rank test (the first pass: the index
    does not hold the file yet), so `if if_main_process():` in a wrapper reads the helper beside it."""

    def __init__(self, returned: dict[str, Returned]):
        self.returned = returned

    def test(self, call: ast.Call) -> RankTest | None:
        found = self.returned.get(call.func.id) if isinstance(call.func, ast.Name) else None
        return found.test if found is not None else None

    def role(self, call: ast.Call) -> None:
        return None

    def tuple_roles(self, call: ast.Call) -> None:
        return None

    def attribute(self, node: ast.Attribute) -> None:
        return None


def gates_of(source: SourceFile, definitions: list[tuple[str, ast.AST]], returned: dict[str, Returned]
             ) -> dict[str, RankSet]:
    """The file's top-level decorators that run what they decorate on some ranks only (first pass)."""
    found: dict[str, RankSet] = {}
    names: RankNames | None = None
    for name, node in definitions:
        if "." in name or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not any(
                isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) for stmt in node.body):
            continue
        names = names or RankNames(source.tree.body, helpers=_SameFile(returned))
        if (gate := rank_gate(node, names)) is not None:
            found[name] = gate
    return found
