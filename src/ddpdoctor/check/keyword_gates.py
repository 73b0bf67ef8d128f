"""Decorators that decide by a keyword argument of each call: the wrapper's `**kwargs` bound to the call.

    def only_leader(fn):
        def wrapper(*args, **kwargs):
            if kwargs.get("leader", True):      # the keyword only: a positional `leader` is not in kwargs
                return fn(*args, **kwargs)
        return wrapper

    @only_leader
    def store(self, step, leader): ...

    self.store(step, self.leader)               # every rank runs it: `leader` went to *args
    self.store(step, leader=self.leader)        # the value decides: rank 0 only where it is a rank test

`keyword_gate(decorator)` reads one decorator: every call of its first parameter in the wrapper it returns
is under `if kwargs.get("k", d):` (or `if kwargs.get("k"):`, `if kwargs["k"]:`) and nothing else; the answer
is `k` and `d` (None where absent). `KeywordGates` finds the gate of a function of the file (its decorator
defined here, or in a project file read again), and `runs(call)` says what one call makes of it: the
keyword's value decides (None), or the default does (True/False). The call is where the decision is made,
so a write under such a function is reported at the call that passes the keyword by position (DDP601).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .guards import GuardedCall
    from .source import SourceFile

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class KeywordGate:
    decorator: str  # as written over the function
    keyword: str
    default: object  # the constant the wrapper uses when the keyword is absent (None: none given)

    def runs(self, call: ast.Call) -> bool | None:
        """Whether this call runs the decorated body: None where the keyword's value decides."""
        for kw in call.keywords:
            if kw.arg == self.keyword:
                return bool(kw.value.value) if isinstance(kw.value, ast.Constant) else None
            if kw.arg is None:
                return None  # `**options` may hold it
        return bool(self.default)


def keyword_gate(func: Function) -> tuple[str, object] | None:
    """The keyword, and its default, that a decorator's wrapper tests before calling the function."""
    params = [*func.args.posonlyargs, *func.args.args]
    returned = {stmt.value.id for stmt in func.body
                if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Name)}
    wrappers = [w for w in func.body if isinstance(w, (ast.FunctionDef, ast.AsyncFunctionDef))
                and w.name in returned and w.args.kwarg is not None]
    if not params or len(wrappers) != 1:
        return None
    wrapped, kwargs = params[0].arg, wrappers[0].args.kwarg.arg  # type: ignore[union-attr]
    found: set[tuple[str, object]] = set()
    if not _covered(wrappers[0].body, wrapped, kwargs, found) or len(found) != 1:
        return None
    return found.pop()


def _covered(body: list[ast.stmt], wrapped: str, kwargs: str, found: set[tuple[str, object]]) -> bool:
    """Every call of `wrapped` in `body` runs under a test of one keyword: inside `if kwargs.get(k, d):`, or
    after `if not kwargs.get(k, d): return`."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            test = _keyword_test(stmt.test, kwargs)
            if test is not None and not stmt.orelse:
                found.add(test)
                continue  # its body runs under the test
            negated = isinstance(stmt.test, ast.UnaryOp) and isinstance(stmt.test.op, ast.Not) and (
                _keyword_test(stmt.test.operand, kwargs))
            if negated and stmt.body and isinstance(stmt.body[-1], (ast.Return, ast.Raise)) and (
                    not stmt.orelse and not _calls(stmt, wrapped)):
                found.add(negated)
                return True  # the rest runs under the test
        if _calls(stmt, wrapped):
            return False
    return True


def _keyword_test(test: ast.expr, kwargs: str) -> tuple[str, object] | None:
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.func.attr == "get" and (
            isinstance(test.func.value, ast.Name) and test.func.value.id == kwargs) and test.args and (
            isinstance(test.args[0], ast.Constant) and isinstance(test.args[0].value, str)):
        default = test.args[1] if len(test.args) > 1 else None
        if default is not None and not isinstance(default, ast.Constant):
            return None
        return test.args[0].value, default.value if default is not None else None
    if isinstance(test, ast.Subscript) and isinstance(test.value, ast.Name) and test.value.id == kwargs and (
            isinstance(test.slice, ast.Constant) and isinstance(test.slice.value, str)):
        return test.slice.value, None
    return None


def _calls(node: ast.AST, wrapped: str) -> int:
    return sum(1 for n in ast.walk(node)
               if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == wrapped)


class KeywordGates:
    """The keyword gates of one file's functions, asked one at a time (memoised)."""

    def __init__(self, source: SourceFile):
        self.source = source
        self.local = {n.name: n for n in source.tree.body if isinstance(n, (ast.FunctionDef,
                                                                            ast.AsyncFunctionDef))}
        self._memo: dict[Function, KeywordGate | None] = {}

    def __call__(self, func: Function) -> KeywordGate | None:
        if func not in self._memo:
            self._memo[func] = next((gate for deco in func.decorator_list
                                     if (gate := self._read(deco)) is not None), None)
        return self._memo[func]

    def _read(self, deco: ast.expr) -> KeywordGate | None:
        if isinstance(deco, ast.Name) and deco.id in self.local:
            found = keyword_gate(self.local[deco.id])
        elif isinstance(deco, (ast.Name, ast.Attribute)) and self.source.project is not None:
            found = _elsewhere(self.source, deco)
        else:
            return None
        return KeywordGate(self.source.segment(deco), *found) if found is not None else None


def _elsewhere(source: SourceFile, deco: ast.expr) -> tuple[str, object] | None:
    """A decorator of another project file, read again there (once per run and process)."""
    project = source.project
    assert project is not None
    callee = project.resolver(source).callee(deco, None)
    if callee is None or (found := project.function(callee[0])) is None or "." in found[0].name:
        return None
    cache: dict[str, dict[str, Function]] = project.__dict__.setdefault("_decorator_files", {})
    path = found[0].path
    if path not in cache:
        cache[path] = {}
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                tree = ast.parse(handle.read())
            cache[path] = {n.name: n for n in tree.body
                           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        except (OSError, SyntaxError, ValueError, RecursionError):
            pass
    node = cache[path].get(found[0].name)
    return keyword_gate(node) if node is not None else None


def missed_keyword(gate: KeywordGate, func: Function, call: ast.Call) -> str | None:
    """How a call that runs the body on every rank leaves the gate's keyword out: passed by position to a
    parameter of that name, or not at all (the wrapper then reads its default)."""
    if gate.runs(call) is not True or any(kw.arg == gate.keyword for kw in call.keywords):
        return None
    params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
    if params and params[0] in ("self", "cls") and isinstance(call.func, ast.Attribute):
        params = params[1:]
    if gate.keyword in params and params.index(gate.keyword) < len(call.args) and not any(
            isinstance(a, ast.Starred) for a in call.args):
        how = f"passes `{gate.keyword}` by position"
    else:
        how = f"leaves `{gate.keyword}` out"
    return (f"`{gate.decorator}` runs `{func.name}()` only when the keyword `{gate.keyword}` says so, and "
            f"reads `{gate.default!r}` where it is absent; this call {how}, so every rank runs it")


def gate_misses(gates: KeywordGates, func: Function | None, sites: Mapping[str, Sequence[GuardedCall]]
                ) -> list[tuple[ast.Call, str]]:
    """The calls of the file (`sites`, by callee name) that make every rank run `func` past its keyword
    gate, each with how (`missed_keyword`)."""
    gate = gates(func) if func is not None and func.decorator_list else None
    if func is None or gate is None:
        return []
    return [(site.call, how) for site in sites.get(func.name, ())
            if (how := missed_keyword(gate, func, site.call)) is not None]
