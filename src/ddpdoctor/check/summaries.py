"""Per-function summaries in the rank domain: what a project function returns, asked across files.

`returned_ranks(source, resolver)` reads each function of a file once (first pass): a rank (`return
int(os.environ["RANK"])`), a tuple holding ranks (`return rank, world_size`), a rank test (`return
dist.get_rank() == 0`), or whatever another project function returns (`return get_dist_info()`). The index
follows those links (`ProjectIndex.returned`, bounded, cycle-safe: a cycle returns nothing known), and
`RankReturns` answers `ranks.RankNames` with it, so `rank, ws = get_rank_and_world_size()` and
`if is_main():` read as rank values and tests wherever the helper is defined.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

from ..collectives import TORCH_DISTRIBUTED, Kind
from .bool_returns import gated_by, true_ranks
from .facts import Passed, Target
from .local_objects import objects_at
from .ranks import RankNames, RankTest, Role, _RoleMarker

if TYPE_CHECKING:
    from .index import Resolver
    from .source import SourceFile

MAX_HOPS = 8
# A file may define a function returning a rank value or test (or test ranks at all) only if its text says
# one of these: the summary's pre-filters.
FILE_WORDS = ("rank", "RANK", "PROCID", "LOCALID", "main_process", "master", "_zero")
# A function can only return a rank value or test if its text says one of these, or returns what a call
# gives (`return get_dist_info()`, `return node_index() == 0`, `return is_global_primary(args)`, whatever the
# helper is named): the cheap pre-filter.
RETURN_WORDS = ("rank", "RANK", "PROCID", "LOCALID", "_zero", "main", "master")


@dataclass(frozen=True)
class Returned:
    """What every `return` of a function gives, in the rank domain (one shape for all of them)."""

    roles: tuple[Role | None, ...] = ()  # the items of a returned tuple (`tuple_items`), or one value
    tuple_items: bool = False
    test: RankTest | None = None
    through: Target | None = None  # the value another project function returns
    # `return node_index() == 0`: a comparison (operator class name, constant) of what `through` returns
    compare: tuple[str, int] | None = None
    # `return local_test(a) if local else global_test(a)` with `local=False` in the signature: the shape of
    # the default's branch, which holds only for a call that leaves the parameter (name, position) out
    unless_passed: tuple[str, int] | None = None

    @property
    def known(self) -> bool:
        return any(self.roles) or self.test is not None or self.through is not None

    def resolved(self, inner: Returned | None) -> Returned | None:
        """This shape once `through` is known to return `inner`."""
        if inner is not None and inner.unless_passed is not None:
            return None  # whether this function's call passes the inner one's flag is not recorded
        if self.compare is None:
            return replace(inner, unless_passed=self.unless_passed) if inner is not None else None
        if inner is None or inner.tuple_items or not inner.roles or inner.roles[0] is None:
            return None
        op, value = self.compare
        test = RankNames([]).test(ast.Compare(_RoleMarker(inner.roles[0]), [getattr(ast, op)()],
                                              [ast.Constant(value)]))
        return Returned(test=test) if test.is_rank_test else None


def returned_ranks(source: SourceFile, resolver: Resolver, functions: list[tuple[str, ast.AST]]
                   ) -> dict[str, Returned]:
    """For each (name, definition) of the file whose returns are rank-shaped, what they return."""
    found: dict[str, Returned] = {}
    for name, node in functions:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        text = source.text_of(node)
        worded = any(w in text for w in RETURN_WORDS)
        if "return" not in text or not (worded or _RETURNS_CALL.search(text)):
            continue  # nothing rank-like to return: no walk
        values = [n.value for n in _returns(node.body)]
        if not values or any(v is None for v in values):
            continue
        if all(isinstance(v, ast.Constant) and isinstance(v.value, bool) for v in values):
            # `if int(os.environ["RANK"]) == 0: return True` / `return False`: the test is the function
            if (answered := true_ranks(node, RankNames(node.body))) is not None:
                found[name] = Returned(test=answered)
            elif (gate := gated_by(node, partial(_callee, resolver, name))) is not None:
                found[name] = Returned(through=gate)  # `if not super()._do_save(): return False`
            continue
        if not any(_returns_call(v) or any(word in source.segment(v) for word in RETURN_WORDS)
                   for v in values if v is not None):
            continue  # what it returns says nothing of ranks (its body may, for other uses)
        if "broadcast" in text and _broadcast_returned(node, values):
            continue  # `return decision[0]` after `broadcast_object_list(decision, src=0)`: every rank's
        # (no rank word in the function: its own names hold no rank, only what a helper returns may)
        names = RankNames(node.body if worded else [])
        # `return 0` / `return True` beside `return dist.get_rank()` / `return rank == 0`: the answer of a
        # run that is not distributed (`if not dist.is_initialized(): return 0`), which the other returns
        # give in a distributed one.
        # `return 0 < every <= steps` beside `return is_main()`: a test of the same value on every rank,
        # so on the other path the value is the rank test's (a may-answer: some path picks ranks)
        shapes = {_shape(v, names, resolver, node.args) for v in values if v is not None and not _fallback(v)
                  and not _uniform_test(source, v)}
        # `return helper()` beside a `return 0`: which the helper's value is, is known only once it is
        # read; beside `return False` only (`if due: return is_main() / return False`), a test's answer
        if len(shapes) == 1 and (shape := shapes.pop()) is not None and shape.known and (
                shape.through is None or len(values) == 1 or shape.compare is None and all(
                    isinstance(v, ast.Constant) and isinstance(v.value, bool)
                    for v in values if v is not None and _fallback(v))):
            found[name] = shape
    return found


# `return helper(...)`, `return a(x) if flag else b(x)`, `return helper() == 0`, `if not helper():`
_RETURNS_CALL = re.compile(r"return [\w.]+\(|if not [\w.]+\(")


def _callee(resolver: Resolver, name: str, func: ast.expr) -> Target | None:
    """The project function a call in the function `name` (`Cls.m` for a method) names."""
    found = resolver.callee(func, name.split(".")[0] if "." in name else None)
    return found[0] if found is not None else None


def _returns_call(value: ast.expr) -> bool:
    """What another function returns (`_shape` follows it): a call, a flag's choice between calls, or a
    call compared with a constant."""
    if isinstance(value, ast.IfExp):
        return _returns_call(value.body) or _returns_call(value.orelse)
    if isinstance(value, ast.Compare):
        return isinstance(value.left, ast.Call)
    return isinstance(value, ast.Call)


def _uniform_test(source: SourceFile, value: ast.expr) -> bool:
    """A comparison that reads no rank-like word and calls nothing (`0 < self.every <= steps`)."""
    return isinstance(value, ast.Compare) and not any(isinstance(n, ast.Call) for n in ast.walk(value)) and (
        not any(word in source.segment(value) for word in RETURN_WORDS))


BROADCASTS = frozenset(op.name for op in TORCH_DISTRIBUTED if op.kind is Kind.BROADCAST)  # the shared table's


def _broadcast_returned(func: ast.AST, values: list[ast.expr | None]) -> bool:
    """A returned name the function passes to a broadcast first: one source's value, the same on every rank
    (the rank-0 decision shared with the others), whatever rank test made it."""
    sent = {arg.id for call in ast.walk(func) if isinstance(call, ast.Call) and call.args
            and isinstance(arg := call.args[0], ast.Name) and (call.func.attr if isinstance(
                call.func, ast.Attribute) else getattr(call.func, "id", "")) in BROADCASTS}
    if not sent:
        return False
    return any(isinstance(n, ast.Name) and n.id in sent for v in values if v is not None for n in ast.walk(v))


def _fallback(value: ast.expr) -> bool:
    return isinstance(value, ast.Constant) and (value.value in (0, -1, 1, True, False) or value.value is None)


def _shape(value: ast.expr, names: RankNames, resolver: Resolver, params: ast.arguments) -> Returned | None:
    if isinstance(value, ast.IfExp) and (chosen := _defaulted(value, params)) is not None:
        branch, flag = chosen
        shape = _shape(branch, names, resolver, params)
        keeps = shape is not None and shape.unless_passed is None
        return replace(shape, unless_passed=flag) if shape is not None and keeps else None
    if isinstance(value, ast.Tuple):
        roles = tuple(names.role(item) for item in value.elts)
        return Returned(roles, tuple_items=True) if any(roles) else None
    role = names.role(value)
    if role is not None:
        return Returned((role,))
    test = names.test(value)
    if test.is_rank_test:
        return Returned(test=test)
    # `return is_global_master(args)`: what the helper returns (its arguments, like a direct call's, are not
    # read: a rank test's shape does not come from them)
    if isinstance(value, ast.Call) and not any(isinstance(a, ast.Starred) for a in value.args):
        callee = resolver.callee(value.func, None)
        if callee is not None:
            return Returned(through=callee[0])
    if isinstance(value, ast.Compare) and len(value.ops) == 1 and isinstance(value.left, ast.Call) and (
            not value.left.args) and isinstance(right := value.comparators[0], ast.Constant) and isinstance(
            right.value, int) and not isinstance(right.value, bool):
        callee = resolver.callee(value.left.func, None)
        if callee is not None:
            return Returned(through=callee[0], compare=(type(value.ops[0]).__name__, right.value))
    return None


def _defaulted(value: ast.IfExp, params: ast.arguments) -> tuple[ast.expr, tuple[str, int]] | None:
    """The branch of `a if flag else b` that a call leaving the parameter `flag` at its constant default
    takes, with that parameter (name, position with a leading `self`/`cls` left out)."""
    if not isinstance(value.test, ast.Name):
        return None
    positional = [*params.posonlyargs, *params.args]
    defaulted = positional[len(positional) - len(params.defaults):]
    defaults: dict[str, ast.expr] = {a.arg: d for a, d in zip(defaulted, params.defaults, strict=True)}
    defaults.update({a.arg: d for a, d in zip(params.kwonlyargs, params.kw_defaults, strict=True)
                     if d is not None})
    default = defaults.get(value.test.id)
    if not isinstance(default, ast.Constant):
        return None
    names = [a.arg for a in positional]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    index = names.index(value.test.id) if value.test.id in names else -1  # -1: keyword-only
    return (value.body if default.value else value.orelse), (value.test.id, index)


def _returns(body: list[ast.stmt]) -> list[ast.Return]:
    """The `return` statements of a function body, not of the functions nested in it."""
    found: list[ast.Return] = []
    stack: list[ast.stmt] = list(body)
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, ast.Return):
            found.append(stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            stack.extend(getattr(stmt, field, None) or [])
        for handler in getattr(stmt, "handlers", ()):
            stack.extend(handler.body)
        for case in getattr(stmt, "cases", ()):
            stack.extend(case.body)
    return found


class RankReturns:
    """`ranks.Helpers` for one file: the project functions its calls name, asked of the index."""

    def __init__(self, source: SourceFile):
        project = source.project
        assert project is not None
        self.project = project
        self.resolver = project.resolver(source)
        self.path = source.path
        self.source = source
        self._classes = [(n.lineno, n.end_lineno or n.lineno, n.name) for n in source.tree.body
                         if isinstance(n, ast.ClassDef)]

    def _returned(self, call: ast.Call) -> Returned | None:
        cls = None
        if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and (
                call.func.value.id in ("self", "cls")):
            # `if self.should_save(step):`: the method of the class the call is written in (or a base's)
            cls = self._class_at(getattr(call, "lineno", 0))
            if cls is None:
                return None
        callee = self.resolver.callee(call.func, cls)
        found = self.project.returned(callee[0]) if callee is not None else None
        flag = found.unless_passed if found is not None else None
        if flag is not None and Passed.of(call).may_pass(flag):
            return None  # the flag is passed: which branch it picks is not read
        return found

    def role(self, call: ast.Call) -> Role | None:
        found = self._returned(call)
        return found.roles[0] if found is not None and not found.tuple_items and found.roles else None

    def tuple_roles(self, call: ast.Call) -> tuple[Role | None, ...] | None:
        found = self._returned(call)
        return found.roles if found is not None and found.tuple_items else None

    def test(self, call: ast.Call) -> RankTest | None:
        found = self._returned(call)
        return found.test if found is not None else None

    def attribute(self, node: ast.Attribute) -> Role | RankTest | None:
        """What `self.x` / `args.x` holds in the rank domain, from its bindings across the project."""
        if isinstance(node.value, ast.Name) and (
                made := objects_at(self.source, self.resolver, node).get(node.value.id)) is not None:
            # `distr.is_global_main`, a property of the object's class that returns a rank test
            found = self.project.returned(Target(made.path, f"{made.name}.{node.attr}"))
            return found.test if found is not None and not found.unless_passed else None
        attributes = self.project.attributes
        if node.attr not in attributes.words:
            return None
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            cls = self._class_at(getattr(node, "lineno", 0))
            return attributes.of_self(self.path, cls, node.attr) if cls is not None else None
        return attributes.of_other(node.attr, self.path)

    @property
    def words(self) -> frozenset[str]:
        """The names that may give a rank test: attributes bound to one somewhere, methods (properties) of
        a project class returning one, and project functions returning one (`if leader():`)."""
        project = self.project
        return project.attributes.words | project.rank_test_methods() | project.rank_functions()

    def _class_at(self, line: int) -> str | None:
        return next((name for first, last, name in self._classes if first <= line <= last), None)
