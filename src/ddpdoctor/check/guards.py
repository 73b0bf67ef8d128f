"""Which calls run on only some ranks: one structured walk over a file that tracks rank guards.

A call is rank-guarded when it sits in a branch of an `if` on a rank condition (see `ranks.py`), after an
early `return`/`raise`/`continue`/`break` under one, or in a function decorated with `rank_zero_only` (or
accelerate's `on_main_process` family). An `if` whose two branches issue the same collectives, in the same
order, does not guard them: every rank still makes the same calls (`if main: x = gather(t); log(x)
else: gather(t)`). A rank test inside an expression (`src = 0 if rank == 0 else None`) only chooses a
value and guards nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .ranks import RankNames
from .source import SourceFile

RANK_ZERO_DECORATORS = frozenset({"rank_zero_only", "on_main_process", "on_local_main_process",
                                  "on_last_process", "on_process", "on_local_process"})

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Guard:
    """Why a call runs on some ranks only: the rank test (or decorator) and where it is."""

    node: ast.AST
    description: str
    line: int


@dataclass(frozen=True)
class GuardedCall:
    call: ast.Call
    guard: Guard | None
    function: Function | None
    cls: ast.ClassDef | None


def terminates(body: list[ast.stmt]) -> bool:
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(last, ast.If):
        return terminates(last.body) and terminates(last.orelse)
    return False


class RankFlow:
    """Walk a file once; `calls` lists every call with the rank guard it runs under (or None).

    `signature(stmts)` gives the collectives a statement list issues, used to see that both branches of a
    rank test make the same calls.
    """

    def __init__(self, source: SourceFile, signature: Callable[[list[ast.stmt]], tuple[str, ...]]):
        self.source = source
        self.signature = signature
        self.calls: list[GuardedCall] = []
        self._function: Function | None = None
        self._class: ast.ClassDef | None = None
        self._block(source.tree.body, None, RankNames(source.tree.body))

    def _describe(self, node: ast.AST, prefix: str) -> Guard:
        text = self.source.segment(node).split("\n", 1)[0]
        if len(text) > 60:
            text = text[:57] + "..."
        return Guard(node, f"{prefix}{text}", node.lineno)  # type: ignore[attr-defined]

    def _block(self, stmts: list[ast.stmt], guard: Guard | None, names: RankNames) -> None:
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._enter_function(stmt, names)
            elif isinstance(stmt, ast.ClassDef):
                self._expressions(stmt.decorator_list + stmt.bases, guard)
                outer, self._class = self._class, stmt
                self._block(stmt.body, guard, names)
                self._class = outer
            elif isinstance(stmt, ast.If):
                guard = self._if(stmt, guard, names)
            else:
                self._statement(stmt, guard, names)

    def _if(self, stmt: ast.If, guard: Guard | None, names: RankNames) -> Guard | None:
        self._expressions([stmt.test], guard)
        body_restricted, else_restricted = names.polarity(stmt.test)
        if not (body_restricted or else_restricted) or guard is not None:
            self._block(stmt.body, guard, names)
            self._block(stmt.orelse, guard, names)
            return guard
        if self.signature(stmt.body) == self.signature(stmt.orelse):
            self._block(stmt.body, None, names)
            self._block(stmt.orelse, None, names)
            return None
        here = self._describe(stmt, "if ")
        self._block(stmt.body, here if body_restricted else None, names)
        self._block(stmt.orelse, here if else_restricted else None, names)
        # An early exit on some ranks leaves the rest of the block to the others.
        if else_restricted and terminates(stmt.body) or body_restricted and terminates(stmt.orelse):
            return here
        return None

    def _statement(self, stmt: ast.stmt, guard: Guard | None, names: RankNames) -> None:
        for _field, value in ast.iter_fields(stmt):
            if isinstance(value, list):
                if not value:
                    continue
                if isinstance(value[0], ast.stmt):
                    self._block(value, guard, names)
                elif isinstance(value[0], ast.excepthandler):
                    for handler in value:
                        self._expressions([handler.type] if handler.type else [], guard)
                        self._block(handler.body, guard, names)
                elif isinstance(value[0], ast.match_case):
                    for case in value:
                        self._block(case.body, guard, names)
                elif isinstance(value[0], ast.withitem):
                    self._expressions([item.context_expr for item in value], guard)
                elif isinstance(value[0], ast.expr):
                    self._expressions(value, guard)
            elif isinstance(value, ast.expr):
                self._expressions([value], guard)

    def _expressions(self, nodes: list[ast.expr], guard: Guard | None) -> None:
        stack: list[ast.AST] = list(nodes)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Lambda):
                continue  # runs later, wherever it is called
            if isinstance(node, ast.Call):
                self.calls.append(GuardedCall(node, guard, self._function, self._class))
            stack.extend(ast.iter_child_nodes(node))

    def _enter_function(self, func: Function, names: RankNames) -> None:
        self._expressions(func.decorator_list, None)
        guard = None
        for deco in func.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            last = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if last in RANK_ZERO_DECORATORS:
                guard = self._describe(deco, "@")
        outer_function, outer_class = self._function, self._class
        self._function, self._class = func, outer_class
        inner = RankNames(func.body, names)
        # Parameters shadow module-level rank variables (but a parameter called `rank` is a rank).
        for arg in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs):
            if arg.arg not in inner.values and arg.arg not in ("rank", "global_rank", "local_rank"):
                inner.values.discard(arg.arg)
                inner.flags.pop(arg.arg, None)
        self._block(func.body, guard, inner)
        self._function, self._class = outer_function, outer_class


def branch_calls(stmts: list[ast.stmt]) -> Iterator[ast.Call]:
    """Calls in a statement list, in source order, not descending into nested functions or lambdas."""
    for stmt in stmts:
        stack: list[ast.AST] = [stmt]
        found: list[ast.Call] = []
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(node, ast.Call):
                found.append(node)
            stack.extend(ast.iter_child_nodes(node))
        found.sort(key=lambda c: (c.lineno, c.col_offset))
        yield from found
