"""The folders a module puts on `sys.path` at run time, for resolving the imports that only work after it.

Research code often keeps its package in a sibling folder and reaches it with `sys.path.insert(0,
os.path.join(os.path.dirname(__file__), "..", "lib"))`, in the script itself or in a helper module the
script imports first (`import _init_paths`). The folders are evaluated from what the source spells: string
literals (relative ones taken from the module's own folder, where such scripts are started), `__file__`,
`os.path.dirname/join/abspath/realpath/normpath`, `pathlib.Path(...)` with `.parent`, `.parents[n]`,
`.resolve()`, `.absolute()` and `/`, `str(...)`, module-level names bound once, and a parameter of a helper
(`def add_path(p): sys.path.insert(0, p)`) from the module's calls of that helper. Anything else (the
working directory, an environment variable) adds no folder.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from .source import child_nodes, dotted, last_name

_ADDERS = ("sys.path.insert", "sys.path.append", "sys.path.extend", "site.addsitedir")
_NORMALISERS = ("abspath", "realpath", "normpath", "expanduser", "str", "fspath")
_PATH_METHODS = ("resolve", "absolute", "expanduser")
MAX_DEPTH = 24  # a name bound to a name bound to ...: a cycle or absurd chain gives up


def added_folders(tree: ast.Module, path: str) -> tuple[str, ...]:
    """The absolute folders this module adds to `sys.path`, in source order, without repeats."""
    here = os.path.abspath(path)
    bound = _module_bindings(tree)
    found: list[str] = []
    for function, call in _adder_calls(tree):
        for argument in _added_arguments(call):
            for value in _values(argument, here, bound, tree, function, 0):
                if value not in found:
                    found.append(value)
    return tuple(found)


_Function = ast.FunctionDef | ast.AsyncFunctionDef


def _adder_calls(tree: ast.Module) -> Iterator[tuple[_Function | None, ast.Call]]:
    """Each call that adds to `sys.path`, with the function it is written in (None: module level)."""
    def visit(node: ast.AST, function: _Function | None) -> Iterator[tuple[_Function | None, ast.Call]]:
        for child in child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(child, child)
            elif isinstance(child, ast.Call) and (dotted(child.func) or "").endswith(_ADDERS):
                yield function, child
                yield from visit(child, function)
            else:
                yield from visit(child, function)
    yield from visit(tree, None)


def _added_arguments(call: ast.Call) -> list[ast.expr]:
    name = dotted(call.func) or ""
    if name.endswith("insert"):
        return call.args[1:2]
    if name.endswith("extend") and call.args and isinstance(call.args[0], (ast.List, ast.Tuple)):
        return list(call.args[0].elts)
    return call.args[:1]


def _module_bindings(tree: ast.Module) -> dict[str, list[ast.expr]]:
    bound: dict[str, list[ast.expr]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(stmt.value)
    return bound


def _values(node: ast.expr, here: str, bound: dict[str, list[ast.expr]], tree: ast.Module,
            function: ast.FunctionDef | ast.AsyncFunctionDef | None, depth: int) -> list[str]:
    """The folders an expression may name (none where it cannot be evaluated)."""
    if depth > MAX_DEPTH:
        return []
    again = depth + 1
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [os.path.normpath(os.path.join(os.path.dirname(here), node.value))]
    if isinstance(node, ast.Name):
        if node.id == "__file__":
            return [here]
        if function is not None and node.id in _parameters(function):
            return [value for argument in _arguments_at_calls(tree, function, node.id)
                    for value in _values(argument, here, bound, tree, None, again)]
        values = bound.get(node.id, [])
        if len(values) == 1:
            return _values(values[0], here, bound, tree, None, again)
        return []
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):  # pathlib's `/`
        return [os.path.normpath(os.path.join(left, right))
                for left in _values(node.left, here, bound, tree, function, again)
                for right in _parts(node.right, bound)]
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        return [os.path.dirname(value) for value in _values(node.value, here, bound, tree, function, again)]
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and (
            node.value.attr == "parents") and isinstance(node.slice, ast.Constant) and isinstance(
            node.slice.value, int):
        up = node.slice.value + 1
        found = []
        for value in _values(node.value.value, here, bound, tree, function, again):
            for _ in range(up):
                value = os.path.dirname(value)
            found.append(value)
        return found
    if not isinstance(node, ast.Call):
        return []
    name = last_name(node.func)
    if isinstance(node.func, ast.Attribute) and name in _PATH_METHODS and not node.args:
        return _values(node.func.value, here, bound, tree, function, again)
    if name == "dirname" and len(node.args) == 1:
        inner = _values(node.args[0], here, bound, tree, function, again)
        return [os.path.dirname(value) for value in inner]
    if name in _NORMALISERS + ("Path", "PurePath") and len(node.args) == 1:
        inner = _values(node.args[0], here, bound, tree, function, again)
        return [os.path.normpath(value) for value in inner]
    if name == "join" and node.args and isinstance(node.func, ast.Attribute) and not isinstance(
            node.func.value, ast.Constant):  # `os.path.join`, `osp.join`; not `"/".join(parts)`
        heads = _values(node.args[0], here, bound, tree, function, again)
        tails = [_parts(argument, bound) for argument in node.args[1:]]
        if any(not tail for tail in tails):
            return []
        joined = heads
        for tail in tails:
            joined = [os.path.join(head, part) for head in joined for part in tail]
        return [os.path.normpath(value) for value in joined]
    return []


def _parts(node: ast.expr, bound: dict[str, list[ast.expr]]) -> list[str]:
    """A literal path component (or a module-level name bound once to one)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and len(bound.get(node.id, [])) == 1:
        value = bound[node.id][0]
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return [value.value]
    return []


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    arguments = function.args
    return [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]


def _arguments_at_calls(tree: ast.Module, function: ast.FunctionDef | ast.AsyncFunctionDef,
                        parameter: str) -> Iterator[ast.expr]:
    """What the module's own calls of `function` pass for `parameter` (positionally or by keyword)."""
    arguments = function.args
    positional = [a.arg for a in (*arguments.posonlyargs, *arguments.args)]
    index = positional.index(parameter) if parameter in positional else None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == function.name:
            if index is not None and index < len(node.args):
                yield node.args[index]
            for given in node.keywords:
                if given.arg == parameter:
                    yield given.value
