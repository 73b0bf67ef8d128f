"""What a call's argument is known to be without being a literal: not `None`, or a string that does not
start with a prefix a callee tests.

`get_file(path, dest, object_store=store)` where `store` walks a `Sequence[Store]` parameter cannot take the
callee's `if object_store is None:` branch, and `open_store("/local/ckpt.pt")` cannot take its `if
uri.startswith("shared://"):` one: what sits there (a broadcast) is not reached from that call. The first pass
reads each function once per such shape its tests name, beside its literal constants (constant_gates.py);
a call site carries the shapes of its arguments, and a literal argument matches the shapes it satisfies.

A value is known not to be `None` by how every binding of its name in the function makes it: a literal
other than `None`, a display, a comprehension, an f-string, a lambda, a loop over a parameter annotated
as a collection of a type that is not optional (`for store in stores` with `stores: Sequence[Store]`), or
a parameter annotated so without a `None` default. Anything else is unknown, and unknown decides nothing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from enum import Enum


class Shape(Enum):
    NOT_NONE = "not None"  # some object, which one unknown: decides `is None` and nothing else


@dataclass(frozen=True)
class Prefixless:
    """A string known not to start with `prefix` (a literal one that does not, or a shape a test names)."""

    prefix: str


Abstract = Shape | Prefixless

_COLLECTIONS = {"Sequence", "List", "list", "Iterable", "Iterator", "Collection", "Tuple", "tuple", "Set",
                "set", "frozenset", "FrozenSet", "MutableSequence", "AbstractSet"}
_MAYBE = {"Optional", "Any", "object", "None", "Union"}


def matches(fixed: object, gate: object) -> bool | None:
    """Whether a value a call fixes satisfies a gate's shape; None when the gate is a plain constant."""
    if gate is Shape.NOT_NONE:
        return fixed is not None
    if isinstance(gate, Prefixless):
        return fixed == gate or isinstance(fixed, str) and not fixed.startswith(gate.prefix)
    return None


def shapes_tested(test: ast.expr, names: set[str]) -> list[tuple[str, Abstract]]:
    """The shapes a test can decide for the names: `p is None` (not None), `p.startswith("x")` (not "x")."""
    found: list[tuple[str, Abstract]] = []
    for part in ast.walk(test):
        if (isinstance(part, ast.Compare) and isinstance(part.left, ast.Name) and part.left.id in names
                and any(isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)) for op in part.ops)
                and any(isinstance(c, ast.Constant) and c.value is None for c in part.comparators)):
            found.append((part.left.id, Shape.NOT_NONE))
        name, prefixes = _startswith(part)
        if name in names:
            found.extend((name, Prefixless(p)) for p in prefixes)
    return found


def tests_a_shape(test: ast.expr) -> bool:
    """The first pass's filter (constant_gates.compares_a_name): a test of some name's shape."""
    return bool(shapes_tested(test, _AnyName()))


class _AnyName(set[str]):
    def __contains__(self, _name: object) -> bool:
        return True


def _startswith(node: ast.AST) -> tuple[str | None, tuple[str, ...]]:
    """`p.startswith("x")` or `p.startswith(("x", "y"))`: the name and the literal prefixes."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "startswith" and isinstance(node.func.value, ast.Name)
            and len(node.args) == 1 and not node.keywords):
        return None, ()
    arg = node.args[0]
    items = arg.elts if isinstance(arg, ast.Tuple) else [arg]
    if not all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
        return None, ()
    return node.func.value.id, tuple(i.value for i in items)  # type: ignore[attr-defined]


def decide(test: ast.expr, env: dict[str, object]) -> bool | None:
    """A test the shapes (or a literal string's prefix) decide: `p is None`, `p.startswith(...)`; None for any
    other (constant_gates.truth reads the rest)."""
    name, prefixes = _startswith(test)
    if name is not None and name in env:
        value = env[name]
        if isinstance(value, str):
            return value.startswith(prefixes)
        if isinstance(value, Prefixless) and value.prefix in prefixes and len(prefixes) == 1:
            return False
        return None
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name)
            and isinstance(env.get(test.left.id), (Shape, Prefixless))
            and isinstance(right := test.comparators[0], ast.Constant) and right.value is None):
        is_none = False  # a shape is never None
        return is_none if isinstance(test.ops[0], (ast.Is, ast.Eq)) else (
            not is_none if isinstance(test.ops[0], (ast.IsNot, ast.NotEq)) else None)
    return None


class NotNone:
    """Which names of one function are known not to hold `None` (every binding says so)."""

    def __init__(self, func: ast.AST | None):
        self.func = func if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        self._known: dict[str, bool] | None = None

    def __call__(self, expr: ast.expr) -> bool:
        if _made_not_none(expr):
            return True
        if not isinstance(expr, ast.Name) or self.func is None:
            return False
        if self._known is None:
            self._known = self._read(self.func)
        return self._known.get(expr.id, False)

    @staticmethod
    def _read(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, bool]:
        args = func.args
        annotated: dict[str, ast.expr | None] = {}
        positional = [*args.posonlyargs, *args.args]
        tail = positional[len(positional) - len(args.defaults):]
        pairs = [*zip(tail, args.defaults, strict=True), *zip(args.kwonlyargs, args.kw_defaults, strict=True)]
        none_default = {a.arg for a, d in pairs if isinstance(d, ast.Constant) and d.value is None}
        for a in (*positional, *args.kwonlyargs):
            annotated[a.arg] = a.annotation if a.arg not in none_default else None
        known: dict[str, bool] = {name: _not_optional(ann) for name, ann in annotated.items()}
        for node in ast.walk(func):
            if node is not func and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            for name, made in _bindings(node, annotated):
                known[name] = known.get(name, True) and made
        return known


def _bindings(node: ast.AST, annotated: dict[str, ast.expr | None]) -> list[tuple[str, bool]]:
    """The names a statement binds, each with whether the binding is known not to be None."""
    if isinstance(node, ast.Assign):
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        others = [n.id for t in node.targets if not isinstance(t, ast.Name)
                  for n in ast.walk(t) if isinstance(n, ast.Name)]
        return [(n, _made_not_none(node.value)) for n in names] + [(n, False) for n in others]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
        target = node.target
        value = getattr(node, "value", None)
        ok = value is not None and _made_not_none(value) and not isinstance(node, ast.AugAssign)
        return [(target.id, ok)] if isinstance(target, ast.Name) else []
    if isinstance(node, (ast.For, ast.AsyncFor)):
        if isinstance(node.target, ast.Name):
            it = node.iter
            ok = isinstance(it, ast.Name) and it.id in annotated and _elements_not_optional(annotated[it.id])
            ok = ok or isinstance(it, (ast.List, ast.Tuple, ast.Set)) and all(
                _made_not_none(e) for e in it.elts)
            return [(node.target.id, ok)]
        return [(n.id, False) for n in ast.walk(node.target) if isinstance(n, ast.Name)]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [(n.id, False) for item in node.items if item.optional_vars is not None
                for n in ast.walk(item.optional_vars) if isinstance(n, ast.Name)]
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [(node.name, True)]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [((a.asname or a.name).split(".")[0], True) for a in node.names]
    if isinstance(node, ast.comprehension):
        return []  # a comprehension's own scope
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return [(n, False) for n in node.names]
    if isinstance(node, ast.Delete):
        return [(t.id, False) for t in node.targets if isinstance(t, ast.Name)]
    return []


def _made_not_none(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Constant):
        return expr.value is not None
    if isinstance(expr, ast.Call):  # `Store(...)`: a class by its name's case, whose call makes an object
        func = expr.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name[:1].isupper() and not name.isupper() and name not in _MAYBE
    return isinstance(expr, (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp, ast.JoinedStr, ast.Lambda))


def _not_optional(ann: ast.expr | None) -> bool:
    """An annotation that names one type and not `None` (`Store`, `list[int]`); `Optional[...]`, a union,
    `Any`, a quoted one: unknown."""
    if ann is None:
        return False
    if isinstance(ann, ast.Name):
        return ann.id not in _MAYBE
    if isinstance(ann, ast.Attribute):
        return ann.attr not in _MAYBE
    if isinstance(ann, ast.Subscript):
        return _not_optional(ann.value)
    return False


def _elements_not_optional(ann: ast.expr | None) -> bool:
    """`Sequence[Store]`, `list[Store]`, `tuple[Store, ...]`: a collection whose elements are not None."""
    if not isinstance(ann, ast.Subscript):
        return False
    outer = ann.value.id if isinstance(ann.value, ast.Name) else (
        ann.value.attr if isinstance(ann.value, ast.Attribute) else "")
    if outer not in _COLLECTIONS:
        return False
    inner = ann.slice
    if isinstance(inner, ast.Tuple):
        elts = [e for e in inner.elts if not (isinstance(e, ast.Constant) and e.value is Ellipsis)]
        return bool(elts) and all(_not_optional(e) for e in elts)
    return _not_optional(inner)
