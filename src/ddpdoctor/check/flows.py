"""Values the checker follows through containers and attributes: access paths and a class's loops.

An access path names where a value is kept, with constant keys only: `loader`, `loaders['train']`,
`self.data['train']`, `batch[0]`. Two paths relate by prefix (`loaders` holds `loaders['train']`), which is
how a dict of loaders handed to a helper is matched to the key the helper iterates. A subscript with a
computed key has no path: the value is lost there, which makes the checker silent, never wrong.

`ClassLoops` reads one class (from the loops and calls the file's one walk collected): which `self` paths each
method iterates (itself, or through the methods it
calls on `self`, at any depth), and which loops of its methods run over them again and again (an epoch
loop: a `for`/`while` around the iteration). It is what lets a sampler kept on `self`, or a loader handed
to a trainer's constructor, be followed into a `while True:` epoch loop of another method.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .source import dotted, statements

MAX_PATH_PARTS = 8
LOOP_WRAPPERS = ("enumerate", "tqdm", "zip", "iter", "islice", "trange", "track", "cycle")


ANY_KEY = "[*]"  # a subscript with a computed key: `loaders[phase]`, `loaders[name] = DataLoader(...)`
_PARTS = re.compile(r"\.[^.\[]+|\[(?:'[^']*'|\"[^\"]*\"|[^\]]*)\]")


def path_of(node: ast.expr, any_key: bool = False) -> str | None:
    """The access path of an expression (`self.loaders['train']`), or None (calls, computed keys). With
    `any_key`, a computed key is kept as `[*]`, which stands for every key of the container
    (`loaders[phase]` is `loaders[*]`): a dict of loaders filled or read in a loop over its keys."""
    parts: list[str] = []
    while len(parts) < MAX_PATH_PARTS:
        if isinstance(node, ast.Name):
            parts.append(node.id)
            return "".join(reversed(parts))
        if isinstance(node, ast.Attribute):
            parts.append(f".{node.attr}")
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(
                node.slice.value, (str, int)) and not isinstance(node.slice.value, bool):
            parts.append(f"[{node.slice.value!r}]")
            node = node.value
        elif any_key and isinstance(node, ast.Subscript) and not isinstance(node.slice, (ast.Slice,
                                                                                        ast.Constant)):
            parts.append(ANY_KEY)
            node = node.value
        else:
            return None
    return None


def suffix_after(path: str, prefix: str) -> str | None:
    """What `path` adds to `prefix` (`['train']` for `loaders['train']` after `loaders`), or None when
    `prefix` does not hold `path`. A `[*]` on either side stands for any key (`loaders[*]` holds
    `loaders['train']` and is held by `loaders`)."""
    if path == prefix:
        return ""
    if path.startswith(prefix) and path[len(prefix)] in "[.":
        return path[len(prefix):]
    if ANY_KEY not in path and ANY_KEY not in prefix:
        return None
    mine, theirs = _parts(path), _parts(prefix)
    if mine[0] != theirs[0] or len(theirs) > len(mine):
        return None
    for have, want in zip(mine[1:], theirs[1:], strict=False):
        if have != want and not (ANY_KEY in (have, want) and have[0] == want[0] == "["):
            return None
    return "".join(mine[len(theirs):])


def same_place(path: str, other: str) -> bool:
    """Two paths that may name the same value (`[*]` standing for any key)."""
    return suffix_after(path, other) == "" or path == other


def _parts(path: str) -> list[str]:
    """`self.loaders['train']` → `self`, `.loaders`, `['train']`."""
    head = re.match(r"[^.\[]*", path)
    root = head.group(0) if head else ""
    return [root, *_PARTS.findall(path[len(root):])]


def iterated(node: ast.expr) -> ast.expr | None:
    """The iterable a `for` walks: `x`, `enumerate(x)`, `tqdm(x, ...)`, `zip(x, ...)`."""
    while isinstance(node, ast.Call):
        if not node.args:
            return None
        name = (dotted(node.func) or "").rsplit(".", 1)[-1]
        if name not in LOOP_WRAPPERS:
            return None
        node = node.args[0]
    return node


@dataclass(frozen=True)
class Link:
    """One step of a chain through a class: what happens, at which line (the file is the class's)."""

    what: str
    line: int


Chain = tuple[Link, ...]


class ClassLoops:
    """The loops of one class over paths on `self` (`self.loader`, `self.loaders['train']`), from the
    loops and calls of its methods collected by the file's one walk (each with its method's name)."""

    def __init__(self, methods: set[str], loops: list[tuple[str, ast.For | ast.AsyncFor | ast.While]],
                 calls: list[tuple[str, ast.Call]]):
        self.methods = methods
        self.loops = loops
        self.walks: list[tuple[str, int, int, str]] = []  # (method, line, column, self path)
        for method, loop in loops:
            if isinstance(loop, (ast.For, ast.AsyncFor)):
                walked = iterated(loop.iter)
                path = path_of(walked) if walked is not None else None
                if path and path.startswith("self."):
                    self.walks.append((method, loop.lineno, loop.col_offset, path[5:]))
        self.self_calls = [(method, call.lineno, call.col_offset, call.func.attr) for method, call in calls
                           if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
                           and call.func.value.id == "self" and call.func.attr in methods]
        self._iterates: dict[str, dict[str, Chain]] | None = None

    def iterates(self) -> dict[str, dict[str, Chain]]:
        """For each method: the `self` paths (without `self.`) it iterates, itself or through `self.m()`
        calls at any depth, each with the chain that shows it. Computed to a fixed point, cycle-safe."""
        if self._iterates is not None:
            return self._iterates
        found: dict[str, dict[str, Chain]] = {name: {} for name in self.methods}
        for method, line, _, path in self.walks:
            found[method].setdefault(path, (Link(f"`for … in self.{path}`", line),))
        changed = True
        rounds = 0
        while changed and rounds < len(self.methods) + 1:
            changed, rounds = False, rounds + 1
            for method, line, _, callee in self.self_calls:
                mine = found[method]
                for path, chain in list(found[callee].items()):
                    if path not in mine:
                        mine[path] = (Link(f"`self.{callee}()`", line), *chain)
                        changed = True
        self._iterates = found
        return found

    def epoch_loops(self) -> list[tuple[str, Chain]]:
        """The `self` paths iterated inside an outer loop of some method (an epoch loop), with the chain from
        that loop: `while` loop (line 9) → `self.train_epoch()` (line 10) → `for … in self.loader` (line
        15)."""
        reach = self.iterates()
        found: list[tuple[str, Chain]] = []
        seen: set[str] = set()
        for method, outer in self.loops:
            head = Link("`while` loop" if isinstance(outer, ast.While) else "epoch loop", outer.lineno)
            for where, line, column, path in self.walks:
                if path not in seen and where == method and _inside(outer, line, column):
                    seen.add(path)
                    found.append((path, (head, Link(f"`for … in self.{path}`", line))))
            for where, line, column, callee in self.self_calls:
                if where == method and _inside(outer, line, column):
                    for path, chain in reach[callee].items():
                        if path not in seen:
                            seen.add(path)
                            found.append((path, (head, Link(f"`self.{callee}()`", line), *chain)))
        return found


def _inside(loop: ast.stmt, line: int, column: int) -> bool:
    """A node at (line, column) of the same function is in the loop's body (a nested loop's header too)."""
    first, last = loop.lineno, loop.end_lineno or loop.lineno
    return first < line <= last or line == first and column > loop.col_offset


def stored_parameters(init: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, int]:
    """`self.x = x` in `__init__`: the attribute each constructor parameter is kept in (its index, `self`
    counted), tuple assignments included (`self.a, self.b = a, b`)."""
    args = init.args
    position = {a.arg: i for i, a in enumerate((*args.posonlyargs, *args.args, *args.kwonlyargs))}
    stored: dict[str, int] = {}
    for node in statements(init.body):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs: list[tuple[ast.expr, ast.expr]] = [(target, node.value)]
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) and len(
                    target.elts) == len(node.value.elts):
                pairs = list(zip(target.elts, node.value.elts, strict=True))
            for bound, value in pairs:
                if isinstance(bound, ast.Attribute) and isinstance(bound.value, ast.Name) and (
                        bound.value.id == "self") and isinstance(value, ast.Name) and value.id in position:
                    stored.setdefault(bound.attr, position[value.id])
    return stored
