"""The value-flow core: what an expression may hold at a point of a function, in a distributed run.

Rules ask it instead of reading one binding: `Values(source, scope).at(node)` gives the bindings of each
name that reach `node` (every assignment on every path, joined at the end of a branch or loop), and
`Values.constants(expr, at)` the constants the expression may be there (`Consts`). A branch that a
distributed run never takes is dropped: under `if ddp:` (`ddp = world_size != 1`), `if
dist.is_initialized():` or `x if is_distributed else y`, a distributed run takes one side only (`ranks.py`
says which test is such a test), so `device_map = "auto"` followed by `if ddp: device_map = {"": rank}`
holds `{"": rank}` there.

A value the checker cannot read (a call's result, a configuration lookup, a parameter nobody passes) is
`unknown`, never dropped: the rule decides whether that is a hedged finding or none, and says so. A
parameter's values are its default joined with every argument passed to it by the calls of the same file
(`shuffle=True` at the one call of `data_sampler(dataset, shuffle, distributed)`).

The walk is one forward pass over the statements of one scope (nested functions and classes are their own
scopes), started on demand and stopped at the point asked for: nothing is kept between queries but the
answers, and no recursion depends on the program's depth.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass

from .attribute_defaults import declared_values
from .ranks import ALL, NONE, RankNames
from .source import SourceFile, statements

MAX_DEPTH = 6  # names bound to names bound to names...: deeper than that is unknown


@dataclass(frozen=True)
class Bound:
    """One binding of a name: the expression bound, or None where there is none to read (a loop or `with`
    target, an augmented assignment, an unpacking the checker cannot split); a parameter's first binding
    has its index."""

    value: ast.expr | None
    line: int
    parameter: int | None = None


@dataclass(frozen=True)
class Opaque:
    """A value that is not a constant but is known to be this expression (a dict, a call, a tensor)."""

    node: ast.expr


@dataclass(frozen=True)
class Consts:
    """The constants an expression may be, `Opaque` values for known non-constants, and whether some path
    gives a value the checker cannot read (`unknown`, with the reason for a hedge)."""

    values: frozenset[object]
    unknown: str = ""

    def may_be(self, value: object) -> bool:
        return any(v == value and type(v) is type(value) for v in self.values)

    def join(self, other: Consts) -> Consts:
        return Consts(self.values | other.values, self.unknown or other.unknown)

    @property
    def only_unknown(self) -> bool:
        return not self.values and bool(self.unknown)


NOTHING = Consts(frozenset())
Env = dict[str, frozenset[Bound]]


def _unknown(why: str) -> Consts:
    return Consts(frozenset(), why)


def _join(a: Env, b: Env) -> Env:
    out = dict(a)
    for name, bound in b.items():
        out[name] = out[name] | bound if name in out else bound
    return out


class Values:
    """The bindings of one scope (a function's body with its parameters, or a module's top level)."""

    def __init__(self, source: SourceFile, body: list[ast.stmt], function: ast.FunctionDef |
                 ast.AsyncFunctionDef | None = None, names: RankNames | None = None):
        self.source = source
        self.body = body
        self.function = function
        self.names = names or RankNames(body)
        self._start: Env = {}
        if function is not None:
            args = function.args
            for i, arg in enumerate((*args.posonlyargs, *args.args, *args.kwonlyargs)):
                self._start[arg.arg] = frozenset({Bound(None, function.lineno, i)})

    # -- reaching bindings ---------------------------------------------------------------------------
    def at(self, node: ast.AST) -> Env:
        """The bindings that reach the statement holding `node` (before it runs)."""
        line = getattr(node, "lineno", 0)
        found: list[Env] = []
        self._walk(self.body, dict(self._start), line, found)
        if not found:
            return dict(self._start)
        out = found[0]
        for env in found[1:]:
            out = _join(out, env)
        return out

    def _walk(self, stmts: list[ast.stmt], env: Env, line: int, found: list[Env]) -> Env | None:
        """Run `stmts` from `env`; the environment after them, or None when every path leaves."""
        for stmt in stmts:
            if _header_holds(stmt, line):
                found.append(dict(env))  # a copy: the walk goes on binding in `env`
            if isinstance(stmt, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
                return None
            if isinstance(stmt, ast.If):
                side = self.distributed_side(stmt.test)
                after_body = self._walk(stmt.body, dict(env), line, found) if side != "orelse" else None
                after_else = self._walk(stmt.orelse, dict(env), line, found) if side != "body" else None
                if side == "body":
                    after = after_body
                elif side == "orelse":
                    after = after_else
                elif after_body is None or after_else is None:
                    after = after_body if after_else is None else after_else
                else:
                    after = _join(after_body, after_else)
                if after is None:
                    return None
                env = after
            elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                inner = dict(env)
                if isinstance(stmt, (ast.For, ast.AsyncFor)):
                    self._bind(stmt.target, None, stmt.lineno, inner)
                # What the body binds reaches its own start on the next iteration: every binding in it,
                # read once without order (a second ordered walk would double per level of nesting).
                loop_env = _join(inner, _bindings_in(stmt.body))
                after = self._walk(stmt.body, dict(loop_env), line, found)
                env = _join(env, after if after is not None else loop_env)
                rest = self._walk(stmt.orelse, dict(env), line, found)
                env = rest if rest is not None else env
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    if item.optional_vars is not None:
                        self._bind(item.optional_vars, None, stmt.lineno, env)
                after = self._walk(stmt.body, env, line, found)
                if after is None:
                    return None
                env = after
            elif isinstance(stmt, ast.Try):
                after = self._walk(stmt.body, dict(env), line, found)
                joined = after if after is not None else dict(env)
                for handler in stmt.handlers if not self._raises_unlaunched_only(stmt.body) else ():
                    handled = self._walk(handler.body, _join(env, joined), line, found)
                    if handled is not None:
                        joined = _join(joined, handled)
                rest = self._walk(stmt.orelse, dict(joined), line, found)
                env = rest if rest is not None else joined
                final = self._walk(stmt.finalbody, env, line, found)
                if final is not None:
                    env = final
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    self._bind(target, stmt.value, stmt.lineno, env)
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                self._bind(stmt.target, stmt.value, stmt.lineno, env)
            elif isinstance(stmt, ast.AugAssign):
                self._bind(stmt.target, None, stmt.lineno, env)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                env[stmt.name] = frozenset({Bound(None, stmt.lineno)})
            elif isinstance(stmt, ast.Match):
                ends = [self._walk(case.body, dict(env), line, found) for case in stmt.cases]
                for end in ends:
                    if end is not None:
                        env = _join(env, end)
        return env

    def _bind(self, target: ast.expr, value: ast.expr | None, line: int, env: Env) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = frozenset({Bound(value, line)})
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = value.elts if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(
                target.elts) and not any(isinstance(e, ast.Starred) for e in value.elts) else None
            for i, element in enumerate(target.elts):
                self._bind(element, items[i] if items is not None else None, line, env)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, None, line, env)

    def _raises_unlaunched_only(self, body: list[ast.stmt]) -> bool:
        """`try: device = torch.device("cuda", local_rank)`: torch refuses only a negative index, the -1 of
        a run no launcher started, so a distributed run never reaches the `except`."""
        return all(isinstance(stmt, ast.Assign) and isinstance(call := stmt.value, ast.Call)
                   and self.source.resolve(call.func) == "torch.device" and len(call.args) == 2
                   and not call.keywords and isinstance(call.args[0], ast.Constant)
                   and self.names.role(call.args[1]) is not None for stmt in body)

    def distributed_side(self, test: ast.expr) -> str:
        """"body" or "orelse" when a distributed run takes only that side of `test`, else ""."""
        found = self.names.test(test)
        if found.then == ALL and found.orelse == NONE:
            return "body"
        if found.then == NONE and found.orelse == ALL:
            return "orelse"
        return ""

    # -- constants -----------------------------------------------------------------------------------
    def constants(self, expr: ast.expr, at: ast.AST | None = None) -> Consts:
        """The constants `expr` may be where `at` (default: `expr` itself) runs, in a distributed run."""
        return self._constants(expr, self.at(at if at is not None else expr), 0)

    def _constants(self, expr: ast.expr, env: Env, depth: int) -> Consts:
        if depth > MAX_DEPTH:
            return _unknown("too many steps to follow")
        if isinstance(expr, ast.Constant):
            return Consts(frozenset({expr.value}))
        if isinstance(expr, ast.IfExp):
            side = self.distributed_side(expr.test)
            if side == "body":
                return self._constants(expr.body, env, depth + 1)
            if side == "orelse":
                return self._constants(expr.orelse, env, depth + 1)
            body = self._constants(expr.body, env, depth + 1)
            return body.join(self._constants(expr.orelse, env, depth + 1))
        if isinstance(expr, ast.Name):
            bound = env.get(expr.id)
            if bound is None:
                return _unknown(f"`{expr.id}` is not bound in this function")
            out = NOTHING
            for b in bound:
                out = out.join(self._bound(expr.id, b, env, depth))
            return out
        if isinstance(expr, (ast.Dict, ast.List, ast.Tuple, ast.Set, ast.JoinedStr)):
            return Consts(frozenset({Opaque(expr)}))
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
            return self._own_attribute(expr, depth)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            declared = declared_values(self.source, expr.attr)  # `args.x`: its defaults, where declared
            if declared:
                out = NOTHING
                for value in declared:
                    out = out.join(self._constants(value, {}, depth + 1))
                return out
        return _unknown(f"`{_short(self.source.segment(expr))}` is computed at run time")

    def _own_attribute(self, expr: ast.Attribute, depth: int) -> Consts:
        """`self.shuffle`: every `self.shuffle = ...` in the methods of the class around this function (this
        file), joined; a method's parameter bound there is read as that method's parameter."""
        line = self.function.lineno if self.function is not None else 0
        cls = next((n for n in self.source.tree.body if isinstance(n, ast.ClassDef)
                    and n.lineno <= line <= (n.end_lineno or n.lineno)), None)
        shown = f"`self.{expr.attr}`"
        if cls is None:
            return _unknown(f"{shown} is computed at run time")
        out, seen = NOTHING, False
        for method in cls.body:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for stmt in statements(method.body):
                if isinstance(stmt, ast.Assign) and any(
                        isinstance(t, ast.Attribute) and t.attr == expr.attr and isinstance(t.value, ast.Name)
                        and t.value.id == "self" for t in stmt.targets):
                    seen = True
                    scope = scope_of_calls(self.source)(stmt)
                    out = out.join(scope._constants(stmt.value, scope.at(stmt), depth + 1))
        if not seen:
            return _unknown(f"{shown} is not bound in its class in this file")
        return out

    def _bound(self, name: str, bound: Bound, env: Env, depth: int) -> Consts:
        if bound.parameter is not None:
            return self._parameter(name, bound.parameter, depth)
        if bound.value is None:
            return _unknown(f"`{name}` is bound by a loop, `with` or unpacking (line {bound.line})")
        return self._constants(bound.value, env, depth + 1)

    def _parameter(self, name: str, index: int, depth: int) -> Consts:
        """A parameter: its default joined with what the calls of this file pass."""
        function = self.function
        assert function is not None
        args = function.args
        positional = [*args.posonlyargs, *args.args]
        default: ast.expr | None = None
        if index < len(positional):
            first_default = len(positional) - len(args.defaults)
            if index >= first_default:
                default = args.defaults[index - first_default]
        else:
            default = args.kw_defaults[index - len(positional)]
        out = NOTHING
        if default is not None:
            out = out.join(self._constants(default, {}, depth + 1))
        passed = list(_passed(self.source, function, name, index))
        for value, caller in passed:
            out = out.join(caller._constants(value, caller.at(value), depth + 1))
        if not passed and default is None:
            return _unknown(f"`{name}` is a parameter with no call in this file to read it from")
        if not passed:
            # Callers elsewhere may pass anything: the default is one possibility, not all of them.
            return Consts(out.values, out.unknown or f"`{name}` may be passed by a caller in another file")
        return out


def _passed(source: SourceFile, function: ast.FunctionDef | ast.AsyncFunctionDef, name: str, index: int
            ) -> Iterable[tuple[ast.expr, Values]]:
    """The arguments that the calls of `function` by name in the same file pass for its parameter."""
    scopes = scope_of_calls(source)
    for call in source.calls:
        if not (isinstance(call.func, ast.Name) and call.func.id == function.name):
            continue
        value = next((kw.value for kw in call.keywords if kw.arg == name), None)
        if value is None and index < len(call.args) and not any(isinstance(a, ast.Starred)
                                                                 for a in call.args[:index + 1]):
            value = call.args[index]
        if value is not None:
            yield value, scopes(call)


def scope_of_calls(source: SourceFile):
    """A function giving the `Values` of the scope a node is in (one `Values` per scope, made once)."""
    cache: dict[int, Values] = getattr(source, "_values_cache", None) or {}
    source._values_cache = cache  # type: ignore[attr-defined]
    spans = _function_spans(source)

    def values(node: ast.AST) -> Values:
        line = getattr(node, "lineno", 0)
        inner = None
        for first, last, func in spans:
            if first <= line <= last and (inner is None or first >= inner.lineno):
                inner = func
        key = id(inner) if inner is not None else 0
        if key not in cache:
            cache[key] = Values(source, inner.body, inner) if inner is not None else Values(
                source, source.tree.body)
        return cache[key]

    return values


def _function_spans(source: SourceFile) -> list[tuple[int, int, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = getattr(source, "_function_spans", None)
    if found is None:
        found = [(n.lineno, n.end_lineno or n.lineno, n) for n in statements(source.tree.body)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        source._function_spans = found  # type: ignore[attr-defined]
    return found


def _bindings_in(body: list[ast.stmt]) -> Env:
    env: Env = {}
    for stmt in statements(body):
        targets: list[tuple[ast.expr, ast.expr | None]] = []
        if isinstance(stmt, ast.Assign):
            targets = [(t, stmt.value) for t in stmt.targets]
        elif isinstance(stmt, (ast.AugAssign, ast.For, ast.AsyncFor)):
            targets = [(stmt.target, None)]
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [(stmt.target, stmt.value)]
        for target, value in targets:
            for node in ast.walk(target):
                if isinstance(node, ast.Name):
                    bound = Bound(value if node is target else None, stmt.lineno)
                    env[node.id] = env.get(node.id, frozenset()) | {bound}
    return env


def _header_holds(stmt: ast.stmt, line: int) -> bool:
    """`line` is in the part of `stmt` that runs before its body (all of it for a simple statement)."""
    if not line:
        return False
    if isinstance(stmt, (ast.If, ast.While)):
        head = stmt.test
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        head = stmt.iter
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        return stmt.lineno <= line <= max(i.context_expr.end_lineno or stmt.lineno for i in stmt.items)
    elif isinstance(stmt, (ast.Try, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Match)):
        return False
    else:
        return stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno)
    return stmt.lineno <= line <= (head.end_lineno or stmt.lineno)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 40 else text[:37] + "..."
