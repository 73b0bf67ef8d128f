"""Where a nested function runs: the one answer every consumer of a `def` inside a function asks.

A nested function is not part of the function that defines it: its body runs where it is called. Called
by name in its enclosing function (or in a sibling closure), it is a project function like any other: its
body runs under the guard of that call, and its parameters get the call's arguments. Passed as a callable
to a project function (`save_if_main(write, path)`), it runs where that function calls its parameter
(`if is_main: fn(path)`), followed through the project index (`CallGraph` resolves these sites once the
callee's file is known). Passed to anything else (a library, a parameter, returned, stored), where it runs
is unknown: neither evidence that every rank runs it nor a rank test. Never called, it runs nowhere.

The summary name of a nested function is Python's qualified name (`save_models.<locals>.write`,
`Runner.run.<locals>.one_step`). The nested functions are those defined in top-level functions, in methods
of top-level classes, and in the functions nested in those, at any depth (a class defined inside a function
stays part of that function).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .rank_sources import Function

if TYPE_CHECKING:
    from .source import SourceFile

LOCALS = ".<locals>."


@dataclass(frozen=True)
class Passed:
    """A nested function given as an argument to a call: where in the call (position or keyword)."""

    function: Function
    argument: int | str


class NestedFunctions:
    """The summarised functions of a file by qualified name, and the nested ones with their parents."""

    def __init__(self, tree: ast.Module):
        self.names: dict[Function, str] = {}  # a nested function, its qualified name
        self.parent: dict[Function, Function] = {}  # a nested function, the function defining it
        self.children: dict[Function, dict[str, Function]] = {}  # the functions a function defines, by name
        stack: list[tuple[Function, str]] = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                stack.append((node, node.name))
            elif isinstance(node, ast.ClassDef):
                stack.extend((item, f"{node.name}.{item.name}") for item in node.body
                             if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
        while stack:
            func, name = stack.pop()
            for inner in _defined_in(func.body):
                self.names[inner] = f"{name}{LOCALS}{inner.name}"
                self.parent[inner] = func
                self.children.setdefault(func, {})[inner.name] = inner  # the last `def` of a name wins
                stack.append((inner, self.names[inner]))

    def __bool__(self) -> bool:
        return bool(self.parent)

    def visible(self, name: str, within: Function | None) -> Function | None:
        """The nested function `name` means in the body of `within`: one it, or a function enclosing it,
        defines (a closure sees its parents' local functions)."""
        while within is not None:
            found = self.children.get(within, {}).get(name)
            if found is not None:
                return found
            within = self.parent.get(within)
        return None

    def called(self, call: ast.Call, within: Function | None) -> Function | None:
        """The nested function a call `name(...)` in `within` calls."""
        return self.visible(call.func.id, within) if isinstance(call.func, ast.Name) and self else None

    def passed(self, call: ast.Call, within: Function | None) -> list[Passed]:
        """The nested functions a call in `within` passes as arguments (`helper(write, path)`)."""
        if not self:
            return []
        given: list[tuple[int | str, ast.expr]] = [*enumerate(call.args)]
        given += [(kw.arg, kw.value) for kw in call.keywords if kw.arg]
        return [Passed(found, where) for where, arg in given if isinstance(arg, ast.Name)
                and (found := self.visible(arg.id, within)) is not None]


def nested_functions(source: SourceFile) -> NestedFunctions:
    """The file's nested functions, read once per parsed file (kept on the `SourceFile`)."""
    found: NestedFunctions | None = source.__dict__.get("_nested")
    if found is None:
        found = source.__dict__["_nested"] = NestedFunctions(source.tree)
    return found


def _defined_in(body: list[ast.stmt]) -> list[Function]:
    """The functions a body defines (in its compound statements too; not in classes, nor in functions
    they define: those are theirs). Only statement lists are walked: a `def` is never in an expression."""
    found: list[Function] = []
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node)
        elif not isinstance(node, ast.ClassDef) and hasattr(node, "body"):
            stack.extend(node.body)
            for field in ("orelse", "finalbody", "handlers", "cases"):
                stack.extend(getattr(node, field, ()))
    found.sort(key=lambda f: f.lineno)
    return found
