"""What a constant argument turns off in a function: its collectives and its calls that do not run when a
parameter holds that constant.

`def zero_first(local_rank): if local_rank not in (-1, 0): barrier() ... if local_rank == 0: barrier()` makes
no collective when called with `-1` ("not distributed"), and `make_loader(path, rank=-1)` passes its `rank`
there unchanged: a caller writing `make_loader(val_path, rank=-1)` on rank 0 alone issues nothing. The first
pass reads each function once per constant its own tests compare a parameter with (`Gate`); the call graph
joins them with the constants each call passes or leaves to a default (`CallGraph.collective`).

Only tests over the parameter itself are read (`p == c`, `p != c`, `p in (...)`, `p not in (...)`, `<`, `<=`,
`>`, `>=`, `is None`, `is not None`, a bare `p`, `not`, `and`, `or`); any other part of a test is unknown, so
both of its branches may run. A parameter assigned in the function is not read at all; a local bound once to
a truth value over a bare parameter (`synchronize = distributed and dist.is_initialized()`) is read as it.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .facts import CallSite, FunctionSummary

from .argument_shapes import Abstract, Shape, decide, matches, shapes_tested, tests_a_shape
from .source import statements, walk

# A literal, or what a non-literal argument is known to be (argument_shapes.py: not None, a prefix it lacks)
Constant = int | float | str | bool | None | Abstract
Binding = tuple[tuple[int, Constant], ...]  # parameters fixed to constants: (index, value), by index

MAX_CANDIDATES = 6  # constants read per function: the ones its tests name (`-1`, `0`), a few at most


@dataclass(frozen=True)
class Gate:
    """A function with parameter `param` (its index, `self` counted) holding `value`."""

    param: int
    value: Constant
    own_quiet: bool  # none of the collectives it makes itself runs
    unreached: frozenset[int]  # lines of its calls that do not run


def same(a: Constant, b: Constant) -> bool:
    """`True` is not `1` here: a caller's literal matches a test's constant of the same type only."""
    return type(a) is type(b) and a == b


def literal(node: ast.expr | None) -> tuple[bool, Constant]:
    """(True, value) for a literal constant (a negative number included), else (False, None)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool, type(None))):
        return True, node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float))
            and not isinstance(node.operand.value, bool)):
        return True, -node.operand.value
    return False, None


def given_constants(call: ast.Call, not_none: Callable[[ast.expr], bool] | None = None
                    ) -> tuple[tuple[tuple[int | str, Constant], ...], tuple[int, tuple[str, ...]] | None]:
    """The literal arguments of a call (and, given `not_none`, those known not to be None), and how many it
    gives by position and which by keyword."""
    constants: list[tuple[int | str, Constant]] = []
    given: list[tuple[int | str, ast.expr]] = [*enumerate(call.args)]
    given += [(kw.arg, kw.value) for kw in call.keywords if kw.arg]
    for at, arg in given:
        ok, value = literal(arg)
        if ok:
            constants.append((at, value))
        elif not_none is not None and not isinstance(arg, ast.Starred) and not_none(arg):
            constants.append((at, Shape.NOT_NONE))
    open_ended = any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords)
    arity = None if open_ended else (len(call.args), tuple(k.arg for k in call.keywords if k.arg))
    return tuple(constants), arity


def defaults(func: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[tuple[int, Constant], ...]:
    """The literal defaults of a function's parameters, by index (`self` counted)."""
    args = func.args
    positional = [*args.posonlyargs, *args.args]
    found: list[tuple[int, Constant]] = []
    for offset, default in enumerate(args.defaults):
        ok, value = literal(default)
        if ok:
            found.append((len(positional) - len(args.defaults) + offset, value))
    for index, kw_default in enumerate(args.kw_defaults):
        ok, value = literal(kw_default)
        if kw_default is not None and ok:
            found.append((len(positional) + index, value))
    return tuple(found)


def gates(func: ast.FunctionDef | ast.AsyncFunctionDef, params: tuple[str, ...],
          is_collective: Callable[[ast.Call], bool]) -> tuple[Gate, ...]:
    """For each parameter its tests compare with constants, and each such constant: what does not run."""
    compared = set(params) - {"self", "cls"}
    # No test compares a parameter: nothing to walk for (the tests are statements, found without walking
    # the expressions; the walk below only narrows the names, by those the function binds again).
    # A local bound at the top of the body to a flag over a parameter counts (_derived_flags; one bound
    # again is told apart only after the walk).
    if not _tested_constants([n for n in statements(func.body) if n.__class__ in (ast.If, ast.While)],
                             compared, _derived_flags(func, compared)):
        return ()
    # One walk of the function: how often it binds each name, its tests and its calls.
    stores: dict[str, int] = {}
    tests: list[ast.If | ast.While] = []
    calls: list[ast.Call] = []
    for node in walk(func):
        cls = node.__class__
        if cls is ast.Name:
            if node.ctx.__class__ is not ast.Load:  # type: ignore[attr-defined]
                stores[node.id] = stores.get(node.id, 0) + 1  # type: ignore[attr-defined]
        elif cls is ast.Call:
            calls.append(node)  # type: ignore[arg-type]
        elif cls is ast.If or cls is ast.While:
            tests.append(node)  # type: ignore[arg-type]
    # A parameter the function binds again is read until the walk meets a binding of it (_Reach.forget).
    names = compared
    derived = _derived_flags(func, names - stores.keys(), stores)  # (over parameters never bound again)
    tested = _tested_constants(tests, names, derived)
    if not tested:
        return ()
    collectives = {id(c) for c in calls if is_collective(c)}
    found: list[Gate] = []
    memo: dict[int, tuple[int, ...]] = {}  # the calls under a node, walked once for every constant
    for name, values in tested.items():
        for value in values[:MAX_CANDIDATES]:
            reached: set[int] = set()
            env: dict[str, Constant] = {name: value}
            env.update((flag, decided) for flag, expr in derived.items()
                       if (decided := truth(expr, env)) is not None)
            _Reach(env, reached, memo, set(derived)).block(func.body)
            quiet = not any(id(c) in reached for c in calls if id(c) in collectives)
            lines = frozenset(c.lineno for c in calls if id(c) not in reached) - frozenset(
                c.lineno for c in calls if id(c) in reached)
            if quiet and collectives or lines:
                found.append(Gate(params.index(name), value, quiet and bool(collectives), lines))
    return tuple(found)


def _derived_flags(func: ast.FunctionDef | ast.AsyncFunctionDef, names: set[str],
                   stores: dict[str, int] | None = None) -> dict[str, ast.expr]:
    """Locals bound at the top of the body to a truth value over a parameter read bare (`synchronize =
    distributed and dist.is_initialized()`): a test of the local is one of the parameter. Given how often
    the function binds each name, only those bound once."""
    return {target.id: stmt.value for stmt in func.body
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(target := stmt.targets[0], ast.Name)
            and (stores is None or stores.get(target.id) == 1) and _bare_flags(stmt.value, names)}


def _tested_constants(tests: list[ast.If | ast.While], names: set[str],
                      derived: dict[str, ast.expr] | None = None) -> dict[str, list[Constant]]:
    """The constants the tests compare each name with, in the order `ast.walk` meets them."""
    found: dict[str, list[Constant]] = {}
    if not names:
        return found
    for node in tests:
        for name, shape in shapes_tested(node.test, names):  # `if store is None:`, `if p.startswith("x"):`
            if not any(same(shape, v) for v in found.get(name, [])):
                found.setdefault(name, []).append(shape)
        flags = _bare_flags(node.test, names)  # `if distributed and ...:`: a call passing False
        for local in _bare_flags(node.test, set(derived or ())):  # `if synchronize:` (_derived_flags)
            flags += _bare_flags((derived or {})[local], names)
        for flag in flags:
            if not any(same(False, v) for v in found.get(flag, [])):
                found.setdefault(flag, []).append(False)
        for part in walk(node.test):
            if isinstance(part, ast.Compare) and isinstance(part.left, ast.Name) and part.left.id in names:
                for right in part.comparators:
                    items = right.elts if isinstance(right, (ast.Tuple, ast.List, ast.Set)) else [right]
                    for item in items:
                        ok, value = literal(item)
                        if ok and not any(same(value, v) for v in found.get(part.left.id, [])):
                            found.setdefault(part.left.id, []).append(value)
    return found


def _bare_flags(test: ast.expr, names: set[str] | None) -> list[str]:
    """The parameters (any name, for None) a test reads as a bare truth value (`p`, `not p`, `p and q`)."""
    if isinstance(test, ast.Name):
        return [test.id] if names is None or test.id in names else []
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _bare_flags(test.operand, names)
    if isinstance(test, ast.BoolOp):
        return [flag for value in test.values for flag in _bare_flags(value, names)]
    return []


_ORDER: dict[type, Callable[[float, float], bool]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}


def truth(test: ast.expr, env: dict[str, Constant]) -> bool | None:
    """The test's value when the names in `env` hold their constants; None when it depends on more."""
    shaped = decide(test, env)  # type: ignore[arg-type]
    if shaped is not None:
        return shaped
    if isinstance(test, ast.Name) and test.id in env:
        value = env[test.id]
        return None if isinstance(value, Abstract) else bool(value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = truth(test.operand, env)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        values = [truth(v, env) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in values else True if all(v is True for v in values) else None
        return True if True in values else False if all(v is False for v in values) else None
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name)
            and test.left.id in env):
        value, op, right = env[test.left.id], test.ops[0], test.comparators[0]
        if isinstance(value, Abstract):
            return None  # what `decide` leaves: a shape is compared with a value it does not pin
        if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            items = [literal(item) for item in right.elts]
            if not all(ok for ok, _ in items):
                return None
            inside = any(value == item for _, item in items)
            return inside if isinstance(op, ast.In) else not inside
        ok, constant = literal(right)
        if not ok:
            return None
        if isinstance(op, (ast.Is, ast.IsNot)):
            if constant is not None and not isinstance(constant, bool):
                return None
            return (value is constant) == isinstance(op, ast.Is)
        if isinstance(op, (ast.Eq, ast.NotEq)):
            return (value == constant) == isinstance(op, ast.Eq)
        if type(op) in _ORDER and isinstance(value, (int, float)) and isinstance(constant, (int, float)):
            return _ORDER[type(op)](value, constant)
    return None


class _Reach:
    """Walks a body with some names fixed, collecting the calls that may run."""

    def __init__(self, env: dict[str, Constant], reached: set[int], memo: dict[int, tuple[int, ...]],
                 keep: set[str] | None = None):
        self.env = env
        self.reached = reached
        self.memo = memo
        self.keep = keep or set()  # the derived flags: bound once, where they are defined

    def block(self, body: Iterable[ast.stmt]) -> bool:
        """True when the block always leaves (return, raise) under the fixed names."""
        for stmt in body:
            if self.statement(stmt):
                return True
        return False

    def forget(self, node: ast.AST) -> None:
        """A fixed name bound again in `node` holds something else from there on (`if store is None: store =
        open_store(path)`): the tests after it are not decided by it."""
        if len(self.env) > len(self.keep):
            for part in walk(node):
                if (part.__class__ is ast.Name and part.ctx.__class__ is not ast.Load  # type: ignore[attr-defined]
                        and part.id in self.env and part.id not in self.keep):  # type: ignore[attr-defined]
                    del self.env[part.id]  # type: ignore[attr-defined]

    def statement(self, stmt: ast.stmt) -> bool:
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            self.forget(stmt)  # a binding late in the body holds on the next pass through its start
        elif not isinstance(stmt, (ast.If, ast.With, ast.AsyncWith, ast.Try)):
            left = self._statement(stmt)
            self.forget(stmt)
            return left
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    self.forget(item.optional_vars)
        return self._statement(stmt)

    def _statement(self, stmt: ast.stmt) -> bool:
        if isinstance(stmt, (ast.If, ast.While)):
            self._calls(stmt.test)
            value = truth(stmt.test, self.env)
            if isinstance(stmt, ast.While):
                if value is not False:
                    self.block(stmt.body)
                self.block(stmt.orelse)
                return False
            if value is True:
                return self.block(stmt.body)
            if value is False:
                return self.block(stmt.orelse)
            body, orelse = self.block(stmt.body), self.block(stmt.orelse)
            return body and orelse
        if isinstance(stmt, (ast.Return, ast.Raise)):
            self._calls(stmt)
            return True
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self._calls(stmt)  # its calls belong to this function's summary: taken as running
            return False
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            self._calls(stmt.iter)
            self.block(stmt.body)
            self.block(stmt.orelse)
            return False
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                self._calls(item.context_expr)
            return self.block(stmt.body)
        if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            self.block(stmt.body)  # type: ignore[attr-defined]
            for handler in stmt.handlers:  # type: ignore[attr-defined]
                if handler.name:
                    self.env.pop(handler.name, None)
                self.block(handler.body)
            self.block(stmt.orelse)  # type: ignore[attr-defined]
            return self.block(stmt.finalbody)  # type: ignore[attr-defined]
        if isinstance(stmt, ast.Match):
            self._calls(stmt.subject)
            for case in stmt.cases:
                self.block(case.body)
            return False
        self._calls(stmt)
        return False

    def _calls(self, node: ast.AST) -> None:
        found = self.memo.get(id(node))
        if found is None:
            found = self.memo[id(node)] = tuple(id(part) for part in walk(node) if part.__class__ is ast.Call)
        self.reached.update(found)


def parameter_index(params: tuple[str, ...], argument: int | str, bound: bool) -> int | None:
    """The callee's parameter (index, `self` counted) an argument lands in: by keyword, or by position
    (after the receiver of a bound call)."""
    if isinstance(argument, str):
        return params.index(argument) if argument in params else None
    index = argument + (1 if bound else 0)
    return index if index < len(params) else None


def passed(site: CallSite, fixed: Binding, callee: FunctionSummary) -> Binding:
    """The callee's parameters a call fixes to constants: its literal arguments, the caller's fixed
    parameters it passes on, the defaults it leaves; only those the callee tests or passes on."""
    wanted = {gate.param for gate in callee.gates} | {p for s in callee.calls for _, p in s.flows}
    if not wanted:
        return ()
    values: dict[int, Constant] = {}
    if site.arity is not None:
        positional, keywords = site.arity
        shift = 1 if site.bound else 0
        for index, value in callee.defaults:
            if index - shift >= positional and callee.params[index] not in keywords:
                values[index] = value
    for argument, value in site.constants:
        at = parameter_index(callee.params, argument, site.bound)
        if at is not None:
            values[at] = value
    given = dict(fixed)
    for argument, param in site.flows:
        at = parameter_index(callee.params, argument, site.bound)
        if at is not None:
            if param in given:
                values[at] = given[param]
            elif not isinstance(values.get(at), Abstract):  # a shape the caller's own binding gives stays
                values.pop(at, None)  # the caller's own value, not a constant
    return tuple(sorted((i, v) for i, v in values.items() if i in wanted))


def gated(summary: FunctionSummary, fixed: Binding) -> tuple[bool, frozenset[int]]:
    """Under the fixed parameters: whether the function's own collectives are all off, and the lines of its
    calls that do not run."""
    quiet = False
    unreached: frozenset[int] = frozenset()
    for gate in summary.gates if fixed else ():
        if any(index == gate.param and (same(value, gate.value) or matches(value, gate.value))
               for index, value in fixed):
            quiet = quiet or gate.own_quiet
            unreached |= gate.unreached
    return quiet, unreached


def compares_a_name(test: ast.expr) -> bool:
    """The first pass's filter: a test that compares a name with something (`rank == -1`), or reads one
    as a flag (`if distributed and ...`)."""
    if _bare_flags(test, None) or tests_a_shape(test):
        return True
    return any(part.__class__ is ast.Compare and part.left.__class__ is ast.Name  # type: ignore[attr-defined]
               for part in walk(test))


def constants_of(node: ast.AST | None, params: tuple[str, ...], tested: bool,
                 is_collective: Callable[[ast.Call], bool]
                 ) -> tuple[tuple[tuple[int, Constant], ...], tuple[Gate, ...]]:
    """A function's literal defaults, and (when its tests compare a name) what each constant turns off."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return (), ()
    return defaults(node), gates(node, params, is_collective) if tested else ()
