"""Where a program's `set_epoch` calls run: once, before the epochs, or once per epoch.

`DistributedSampler.set_epoch(e)` reseeds the shuffle; it helps only when it runs again at every epoch. A call
written once above the epoch loop (or above ignite's `engine.run(loader, max_epochs=n)`, whose loop is the
library's) sets the first epoch's seed and never changes it again, which is the same as no call at all. This
module finds such calls by where they sit, not by names: the call is in no loop of its function, and a later
statement of that same function runs the epochs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from .source import SourceFile, keyword

# Keywords that give a library's epoch loop its count (ignite's `Engine.run(data, max_epochs=...)`).
EPOCH_COUNT_KEYWORDS = ("max_epochs",)

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)


@dataclass(frozen=True)
class OnceSetEpoch:
    """A `set_epoch` call that runs once, before the statement that runs the epochs."""

    call: ast.Call
    epochs: ast.stmt | ast.Call  # the loop, or the library call looping (`trainer.run(data, max_epochs=n)`)
    by_library: bool  # True when `epochs` is a library's run call rather than a loop in this file


def set_epoch_calls(source: SourceFile) -> list[ast.Call]:
    """The file's `.set_epoch(...)` calls (mentions in comments and strings are not calls)."""
    if "set_epoch" not in source.text:
        return []
    return [c for c in source.calls if isinstance(c.func, ast.Attribute) and c.func.attr == "set_epoch"]


def once_before_epochs(source: SourceFile) -> list[OnceSetEpoch] | None:
    """Every `set_epoch` call of the file, when each of them runs once before a later epoch loop of its own
    function; None when any call may run per epoch (in a loop, in a function a loop or a handler calls, in a
    function with no epoch loop after it), or when the file has none."""
    calls = set_epoch_calls(source)
    if not calls:
        return None
    parents = _parents(source.tree)
    found = []
    for call in calls:
        once = _once(call, parents)
        if once is None:
            return None
        found.append(once)
    return found


def _once(call: ast.Call, parents: dict[int, ast.AST]) -> OnceSetEpoch | None:
    # Climb to the statement list that holds the call; any loop on the way means it repeats.
    child: ast.AST = call
    node = parents.get(id(call))
    while node is not None and not isinstance(node, _SCOPES):
        if isinstance(node, _LOOPS) and child is not getattr(node, "iter", None):
            return None
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return None
        child, node = node, parents.get(id(node))
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        return None
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list:
        return None  # an event handler (`@engine.on(Events.EPOCH_STARTED)`) runs when its event fires
    # The statements after the call's own statement, in its block and in the blocks around it up to the
    # function: one of them must run the epochs.
    for later in _later_statements(call, node, parents):
        epochs = _runs_epochs(later)
        if epochs is not None:
            return OnceSetEpoch(call, epochs, by_library=not isinstance(epochs, _LOOPS))
    return None


def _later_statements(call: ast.Call, scope: ast.AST, parents: dict[int, ast.AST]) -> Iterator[ast.stmt]:
    node: ast.AST = call
    while node is not scope:
        parent = parents[id(node)]
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and node in block:
                yield from block[block.index(node) + 1:]
        node = parent


def _runs_epochs(statement: ast.stmt) -> ast.stmt | ast.Call | None:
    """The loop over epochs or the library call running them, in `statement` (not in a nested function)."""
    for node in _walk_same_scope(statement):
        if isinstance(node, (ast.For, ast.AsyncFor)) and _says_epoch(node.target, node.iter):
            return node
        if isinstance(node, ast.While) and _says_epoch(node.test):
            return node
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run"
                and node.args and any(keyword(node, k) for k in EPOCH_COUNT_KEYWORDS)):
            return node
    return None


def _says_epoch(*nodes: ast.AST) -> bool:
    """The loop's own words say it counts epochs (`for epoch in range(start_epoch, args.epochs)`,
    `while state.epoch < max_epoch`): the author's name for what the loop repeats."""
    for part in nodes:
        for node in ast.walk(part):
            word = (node.id if isinstance(node, ast.Name)
                    else node.attr if isinstance(node, ast.Attribute) else "")
            if "epoch" in word.lower():
                return True
    return False


def _walk_same_scope(node: ast.AST) -> Iterator[ast.AST]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                stack.append(child)


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
