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

# Text without which no rank condition can be spelled (see ranks.py): the per-function pre-filter.
RANK_WORDS = ("rank", "_zero", "main_process", "last_process", "is_master", "PROCID", "LOCALID", "on_process",
              "on_local_process")
RANK_ZERO_DECORATORS = frozenset({"rank_zero_only", "on_main_process", "on_local_main_process",
                                  "on_last_process", "on_process", "on_local_process"})

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Guard:
    """Why a call runs on some ranks only: the rank test (or decorator) and where it is."""

    node: ast.AST
    description: str
    line: int
    branch: ast.If | None = None  # the `if` whose branch (or early exit) this is
    # Inside an `if` whose branches were found balanced: nested rank tests are part of that protocol
    # (`if rank == src: ... else: ...` around per-peer sends), so they guard nothing either.
    trusted: bool = False
    early_exit: bool = False  # the others left at this test (`if rank != 0: return`)

    def where(self) -> str:
        if self.early_exit:
            return f"the others exit early at `{self.description}`, line {self.line}"
        prefix = "" if self.description.startswith("@") else "inside "
        return f"{prefix}`{self.description}`, line {self.line}"


@dataclass(frozen=True)
class GuardedCall:
    call: ast.Call
    guard: Guard | None
    function: Function | None
    cls: ast.ClassDef | None


def rank_zero_decorator(func: Function) -> ast.expr | None:
    """The `@rank_zero_only` (or accelerate `@on_main_process`, ...) decorator of a function, if any."""
    for deco in func.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        last = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if last in RANK_ZERO_DECORATORS:
            return deco
    return None


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
    """Walk a file once; `calls` lists the calls with the rank guard each runs under (or None).

    `balanced(if_stmt, cls)` says whether both branches of a rank test make the same collectives (then
    they guard nothing); `collectives(stmts, cls)`, when given, the set of collective sequences a block can
    make, used to pair complementary rank tests. With `skip_unranked` (the default) only calls that can be
    guarded are listed; without it, every call of the file.
    """

    def __init__(self, source: SourceFile, balanced: Callable[[ast.If, ast.ClassDef | None], bool],
                 skip_unranked: bool = True,
                 collectives: Callable[[list[ast.stmt], ast.ClassDef | None], frozenset | None] | None = None):
        self.source = source
        self.collectives = collectives
        self._paired: set[int] = set()
        # With skip_unranked, only what can be guarded is visited: functions without rank words are
        # skipped, and calls outside any guard are not recorded (DDP101 needs only the guarded ones).
        self.skip_unranked = skip_unranked
        self.balanced = balanced
        self.calls: list[GuardedCall] = []
        self._function: Function | None = None
        self._class: ast.ClassDef | None = None
        module_names = RankNames(source.tree.body)
        # A function body can only hold guarded calls if its text mentions something rank-like.
        self._rank_words = (*RANK_WORDS, *module_names.values, *module_names.flags)
        self._block(source.tree.body, None, module_names)

    def _describe(self, node: ast.AST, prefix: str, branch: ast.If | None = None) -> Guard:
        text = self.source.segment(node).split("\n", 1)[0]
        if len(text) > 60:
            text = text[:57] + "..."
        return Guard(node, f"{prefix}{text}", node.lineno, branch)  # type: ignore[attr-defined]

    def _block(self, stmts: list[ast.stmt], guard: Guard | None, names: RankNames) -> None:
        if guard is None and self.collectives is not None:
            self._pair_complementary(stmts, names)
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

    def _pair_complementary(self, stmts: list[ast.stmt], names: RankNames) -> None:
        """`if local_rank not in (-1, 0): barrier()` ... `if local_rank == 0: barrier()`: two rank tests in one
        block, with different conditions, making the same collectives. This is the "main process first"
        idiom (the others wait at the first barrier, rank 0 at the second); each rank makes the call once."""
        candidates = [s for s in stmts if isinstance(s, ast.If) and not s.orelse
                      and names.polarity(s.test) != (False, False)]
        if len(candidates) < 2:
            return
        assert self.collectives is not None
        groups: dict[frozenset, list[ast.If]] = {}
        for stmt in candidates:
            paths = self.collectives(stmt.body, self._class)
            if paths and any(p for p in paths):
                groups.setdefault(paths, []).append(stmt)
        for group in groups.values():
            if len({ast.dump(s.test) for s in group}) > 1:
                self._paired.update(id(s) for s in group)

    def _if(self, stmt: ast.If, guard: Guard | None, names: RankNames) -> Guard | None:
        self._expressions([stmt.test], guard)
        body_restricted, else_restricted = names.polarity(stmt.test)
        if not (body_restricted or else_restricted) or guard is not None:
            self._block(stmt.body, guard, names)
            self._block(stmt.orelse, guard, names)
            return guard
        if id(stmt) in self._paired or self.balanced(stmt, self._class):
            trusted = Guard(stmt.test, "", stmt.lineno, stmt, trusted=True)
            self._block(stmt.body, trusted, names)
            self._block(stmt.orelse, trusted, names)
            return None
        here = self._describe(stmt.test, "if ", stmt)
        self._block(stmt.body, here if body_restricted else None, names)
        self._block(stmt.orelse, here if else_restricted else None, names)
        # An early exit on some ranks leaves the rest of the block to the others.
        if else_restricted and terminates(stmt.body) or body_restricted and terminates(stmt.orelse):
            return Guard(here.node, here.description, here.line, stmt, early_exit=True)
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
        if guard is None and self.skip_unranked:
            return
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
        deco = rank_zero_decorator(func)
        guard = self._describe(deco, "@") if deco is not None else None
        if guard is None and self.skip_unranked:
            text = self.source.text_of(func)
            if not any(word in text for word in self._rank_words):
                return
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
