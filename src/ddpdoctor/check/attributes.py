"""Attributes as values, across the project: what `self.x` or `args.x` holds in the rank domain.

A rank or a rank test is often kept on an object: a trainer's constructor takes `device_id` and keeps it on
`self.device_id`, which its methods then test (`if self.device_id <= 0:`), or a script sets
`args.is_master = args.rank == 0` and a module of another file tests `args.is_master`. The first pass
records, per file:

- `AttributeBinding`: for `self.x = <expr>` in any method of a class, what every such binding gives
  (a rank role, a rank test, or a parameter of the method, to be read at the method's call sites); for
  `obj.x = <expr>` on another object (`args`, `cfg`), the rank-valued ones, keyed by the attribute's name;
- `RankArgument`: the calls of project functions and constructors that pass a rank value or test.

`CallGraph.attribute_rank` joins them: a parameter kept on `self` holds what its callers pass, an
attribute bound in a base class (another file) is found through the class's bases. A binding that is not
rank-shaped (anything but the fallbacks `None`, `0`, `-1`, `True`, `False` of a run that is not
distributed) spoils the attribute: it is then not a rank, never guessed.
"""

from __future__ import annotations

import ast
import bisect
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .facts import Passed, Target
from .rank_sets import UNIFORM, RankTest, Role, join, meet
from .rank_sources import (
    RANK_WORDS,
    _distributed_flag,
    _flag_test,
    _role_of_name,
    fallback_constant,
)
from .ranks import RankNames

if TYPE_CHECKING:
    from .callgraph import CallGraph
    from .index import Resolver
    from .source import SourceFile

OTHER = ""  # the class of an attribute bound on an object that is not `self` (`args.x`)


# The project functions a conjunction calls (with what each call passes) and the test of its other parts.
Conjunction = tuple[tuple[tuple[Target, Passed], ...], RankTest]


@dataclass(frozen=True)
class AttributeBinding:
    """Every binding of one attribute in one file: `cls` is the class whose methods bind `self.<attr>`,
    or `OTHER` for `args.<attr>`. `params` are `(method, parameter index with self counted)`."""

    cls: str
    attr: str
    roles: frozenset[Role] = frozenset()
    tests: frozenset[RankTest] = frozenset()
    params: tuple[tuple[str, int], ...] = ()
    # `args.save_logs = args.logs and is_master(args)`: the project functions called in a conjunction
    # (each with the flag its call passes, if it may pass one) and the test of its other parts, the whole
    # read once the index knows what the functions return
    conjunctions: tuple[Conjunction, ...] = ()
    spoiled: bool = False


@dataclass(frozen=True)
class RankArgument:
    """A call of a project function or class passing a rank value or test: the parameter (its index,
    `self` counted for methods and constructors, or its keyword) and what it holds."""

    target: Target
    parameter: int | str
    role: Role | None
    test: RankTest | None
    # `Trainer(is_vis=dist.is_visualizer())`: the project function whose result is passed, read once the
    # index knows what it returns
    via: Target | None = None
    line: int = 0  # the call's line (rank_parameters.py reads each call of a function apart)


def _functions(tree: ast.Module) -> Iterable[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield None, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield node.name, item


def attribute_bindings(source: SourceFile, assigns: list[ast.Assign], resolver: Resolver | None = None
                       ) -> tuple[AttributeBinding, ...]:
    """The rank-shaped attribute bindings of a file (first pass, no project needed), from its assignments
    (`Resolver.assigns`, collected by the one walk over the file)."""
    wanted = [a for a in assigns if any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                                        for t in a.targets)]
    if not wanted:
        return ()
    functions = sorted(((f.lineno, f.end_lineno or f.lineno, cls, f) for cls, f in _functions(source.tree)),
                       key=lambda item: item[0])
    starts = [first for first, *_ in functions]
    found: dict[tuple[str, str], AttributeBinding] = {}
    names_of: dict[int, RankNames] = {}
    for stmt in wanted:
        at = bisect.bisect_right(starts, stmt.lineno) - 1
        cls, func = (functions[at][2], functions[at][3]) if at >= 0 and stmt.lineno <= functions[at][1] else (
            None, None)
        for target in stmt.targets:
            if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)):
                continue
            own = target.value.id == "self" and cls is not None
            key = (cls if own and cls is not None else OTHER, target.attr)
            old = found.get(key, AttributeBinding(*key))
            value = stmt.value
            if fallback_constant(value):
                found.setdefault(key, old)
                continue
            if own and func is not None and isinstance(value, ast.Name) and value.id in (
                    params := _params(func)):
                found[key] = replace(old, params=(*old.params, (func.name, params[value.id])))
                continue
            if not any(word in source.segment(value) for word in RANK_WORDS):
                found[key] = replace(old, spoiled=True)  # not rank-shaped: cheaply told, no scope read
                continue
            scope = id(func) if func is not None else 0
            if scope not in names_of:
                module = names_of.get(0) or RankNames(source.tree.body)
                names_of[0] = module
                names_of[scope] = RankNames(func.body, module) if func is not None else module
            names = names_of[scope]
            role = names.role(value)
            test = names.test(value) if role is None else None
            if role is not None:
                found[key] = replace(old, roles=old.roles | {role})
            elif test is not None and test.is_rank_test:
                found[key] = replace(old, tests=old.tests | {test})
            elif resolver is not None and (conjunction := _conjunction(value, names, resolver)) is not None:
                found[key] = replace(old, conjunctions=(*old.conjunctions, conjunction))
            else:
                found[key] = replace(old, spoiled=True)
    # A spoiled `args.x` is kept too: a binding in any file spoils the name project-wide.
    return tuple(b for b in found.values() if b.roles or b.tests or b.params or b.conjunctions or b.spoiled)


def _conjunction(value: ast.expr, names: RankNames, resolver: Resolver
                 ) -> Conjunction | None:
    """`a and b and helper(args)` (or `helper(args)` alone) where some parts call project functions: those
    calls, and the test of the other parts."""
    parts = value.values if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.And) else [value]
    calls: list[tuple[Target, Passed]] = []
    rest: list[ast.expr] = []
    for part in parts:
        callee = resolver.callee(part.func, None) if isinstance(part, ast.Call) else None
        if callee is not None and isinstance(part, ast.Call):
            calls.append((callee[0], Passed.of(part)))
        else:
            rest.append(part)
    if not calls:
        return None
    others = names.test(ast.BoolOp(ast.And(), rest) if len(rest) > 1 else rest[0]) if rest else UNIFORM
    return tuple(calls), others


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, int]:
    args = func.args
    return {a.arg: i for i, a in enumerate((*args.posonlyargs, *args.args, *args.kwonlyargs))}


def rank_arguments(call: ast.Call, target: Target, bound: bool, names: RankNames | None,
                   project_call: Callable[[ast.expr], Target | None]) -> list[RankArgument]:
    """What a call of a project function or class passes that holds a rank value or test (`names`: the
    call's scope, None where its text names no rank), or the result of a project function
    (`project_call`) that may."""
    offset = 1 if bound or target.name[:1].isupper() and "." not in target.name else 0
    passed: list[tuple[int | str, ast.expr]] = [(i + offset, a) for i, a in enumerate(call.args)
                                                 if not isinstance(a, ast.Starred)]
    passed += [(kw.arg, kw.value) for kw in call.keywords if kw.arg]
    found = []
    for parameter, value in passed:
        if isinstance(value, ast.Constant):
            continue
        via = project_call(value.func) if isinstance(value, ast.Call) and not value.args else None
        if via is not None:
            found.append(RankArgument(target, parameter, None, None, via, call.lineno))
            continue
        if names is None:
            continue
        role = names.role(value)
        test = names.test(value) if role is None else None
        if role is not None or test is not None and test.is_rank_test:
            found.append(RankArgument(target, parameter, role, test, line=call.lineno))
    return found


def tested_attributes(tests: Iterable[ast.If | ast.While]) -> frozenset[str]:
    """The attribute names that a file's `if` and `while` tests read (`if args.main:`, `if self.gpu <= 0:`):
    where an attribute bound in another file can change what the file's rules see."""
    found: set[str] = set()
    for stmt in tests:
        test = stmt.test
        parts = test.values if isinstance(test, ast.BoolOp) else [test]
        for part in parts:
            if isinstance(part, ast.UnaryOp):
                part = part.operand
            if isinstance(part, ast.Compare):
                part = part.left
            if isinstance(part, ast.Attribute):
                found.add(part.attr)
    return frozenset(found)


MAX_BASES = 8


class AttributeRanks:
    """The project's attributes in the rank domain, joined over every file (`CallGraph.attributes`)."""

    def __init__(self, graph: CallGraph):
        # A weak reference: the graph holds this object, and a cycle would outlive the run's index (the
        # runner turns the cycle collector off while it checks).
        self.graph = weakref.proxy(graph)
        self.size = len(graph.modules)
        self.own: dict[tuple[str, str, str], AttributeBinding] = {}
        self.other: dict[str, list[tuple[str, AttributeBinding]]] = {}  # by name: (module, binding)
        self.arguments: dict[tuple[Target, int], list[RankArgument]] = {}
        for module in graph.modules.values():
            for binding in module.attributes:
                if binding.cls == OTHER:
                    self.other.setdefault(binding.attr, []).append((module.path, binding))
                else:
                    self.own[(module.path, binding.cls, binding.attr)] = binding
        for module in graph.modules.values():
            for argument in module.rank_arguments:
                called = called_parameter(graph, argument)
                if called is not None:
                    self.arguments.setdefault(called, []).append(argument)
        # The attribute names that may hold a rank somewhere and that their name alone does not tell
        # (`self.rank` is read as a rank anyway): the rules' pre-filter, and which files to read again.
        self.words = frozenset(attr for attr, found in self.other.items() if not _named(attr) and any(
            b.roles or b.tests or b.conjunctions for _, b in found)) | frozenset(
            attr for (path, cls, attr), b in self.own.items() if not _named(attr) and (
                b.roles or b.tests or any((Target(path, f"{cls}.{method}"), i) in self.arguments
                                          for method, i in b.params)))

    def of_self(self, path: str, cls: str, attr: str) -> Role | RankTest | None:
        """`self.<attr>` in a method of `cls` (defined in `path`), its bases searched across files."""
        at = Target(path, cls)
        for _ in range(MAX_BASES):
            binding = self.own.get((at.path, at.name, attr))
            if binding is not None:
                return self._join(binding, at)
            module = self.graph.modules.get(at.path)
            bases = module.functions.get(f"{at.name}.__bases__") if module is not None else None
            if bases is None or not bases.calls:
                return None
            at = bases.calls[0].target
        return None

    def of_other(self, attr: str, path: str) -> Role | RankTest | None:
        """`args.<attr>` (any object but `self`) read in `path`: every binding of the name in the files of
        its program (connected by project imports)."""
        found = self.other.get(attr)
        if not found:
            return None
        program = {m.path for m in self.graph.component(path)} if len(found) > 1 else None
        bindings = [b for where, b in found if program is None or where in program]
        if not bindings or any(b.spoiled for b in bindings):
            return None
        tests = self._conjunctions(bindings)
        if tests is None:
            return None
        return _one(frozenset().union(*(b.roles for b in bindings)), frozenset().union(tests, *(
            b.tests for b in bindings)))

    def _conjunctions(self, bindings: Iterable[AttributeBinding]) -> frozenset[RankTest] | None:
        """The tests of the bindings' conjunctions; None if one is not a rank test (the attribute is not)."""
        tests: set[RankTest] = set()
        for binding in bindings:
            for conjunction in binding.conjunctions:
                test = self._conjunction(conjunction)
                if test is None:
                    return None
                tests.add(test)
        return frozenset(tests)

    def _conjunction(self, conjunction: Conjunction) -> RankTest | None:
        """The test of `a and helper(args)`: every part must hold, so never more ranks than the helper's."""
        calls, test = conjunction
        for target, passed in calls:
            returned = self.graph.returned(target)
            if returned is None or returned.test is None or (
                    returned.unless_passed is not None and passed.may_pass(returned.unless_passed)):
                return None
            test = RankTest(meet(test.then, returned.test.then), join(test.orelse, returned.test.orelse))
        return test if test.is_rank_test else None

    def _join(self, binding: AttributeBinding, at: Target) -> Role | RankTest | None:
        joined = self._conjunctions((binding,))
        if binding.spoiled or joined is None:
            return None
        roles, tests = set(binding.roles), set(binding.tests) | joined
        for method, index in binding.params:
            passed = self.arguments.get((Target(at.path, f"{at.name}.{method}"), index))
            if not passed:
                return None  # a parameter no caller is seen passing a rank to: not known to be one
            roles.update(a.role for a in passed if a.role is not None)
            tests.update(a.test for a in passed if a.test is not None)
            for argument in passed:
                returned = self.graph.returned(argument.via) if argument.via is not None else None
                if returned is not None and returned.unless_passed is None:
                    if returned.test is not None:
                        tests.add(returned.test)
                    elif len(returned.roles) == 1 and not returned.tuple_items and returned.roles[0]:
                        roles.add(returned.roles[0])
        return _one(frozenset(roles), frozenset(tests))


def _named(attr: str) -> bool:
    """The attribute's name says what it holds (`rank`, `local_rank`, `is_main_process`, `distributed`)."""
    return _role_of_name(attr, attribute=True) is not None or _flag_test(attr) is not None or (
        _distributed_flag(attr))


def _one(roles: frozenset[Role], tests: frozenset[RankTest]) -> Role | RankTest | None:
    if len(roles) == 1 and not tests:
        return next(iter(roles))
    if len(tests) == 1 and not roles:
        return next(iter(tests))
    return None


def called_parameter(graph: CallGraph, argument: RankArgument) -> tuple[Target, int] | None:
    """The function a rank argument is passed to (a class's constructor for `Cls(...)`) and the index of
    its parameter (-1: a keyword it has no parameter of), or None where the call names no project function."""
    target = argument.target
    if "." not in target.name and target.name[:1].isupper():
        target = Target(target.path, f"{target.name}.__init__")
    found = graph.function(target)
    if found is None:
        return None
    params = found[1].params
    index = argument.parameter if isinstance(argument.parameter, int) else (
        params.index(argument.parameter) if argument.parameter in params else -1)
    return found[0], index
