"""Functions that issue collectives, and the collective paths through a block of code.

DDP101 uses this to follow a rank-guarded call into a function (`if rank == 0: sync()` where `sync` calls
`dist.barrier()`), at any depth: functions of the same file directly, functions of other modules of the
project (and inherited methods) through the project index, which also gives the chain of calls for the
message. It also decides whether the two branches of a rank test make the same collectives.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from .argument_shapes import NotNone
from .collectives import CollectiveCalls
from .guards import Function, branch_calls, rank_zero_decorator
from .local_objects import objects_at
from .nested import nested_functions
from .project import Step, Target
from .rank_paths import enclosing_function
from .ranks import DISTRIBUTED, RankNames
from .source import SourceFile

Decide = Callable[[ast.expr], bool | None]  # a test's value for the ranks a walk asks about (None: unknown)


class CollectiveFunctions:
    """Functions and methods of this file that issue a collective, directly or through each other.

    Computed on demand (only for functions called under a rank guard). Functions decorated with
    `rank_zero_only` are left out: their collectives are reported inside them.
    """

    def __init__(self, source: SourceFile, labels: CollectiveCalls):
        self.labels = labels
        self.module_functions: dict[str, Function] = {
            node.name: node
            for node in source.tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        for name in source.imports.names:  # `from x import f` after `def f` rebinds it
            self.module_functions.pop(name, None)
        self.methods: dict[tuple[str, str], Function] = {}
        self.owner: dict[Function, ast.ClassDef | None] = {f: None for f in self.module_functions.values()}
        for cls in source.classes.values():
            for node in cls.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.methods[(cls.name, node.name)] = node
                    self.owner[node] = cls
        self._memo: dict[Function, tuple[str, ast.Call] | None] = {}
        self.path = source.path
        self.source = source
        self.nested = nested_functions(source)
        self.project = source.project
        self.resolver = self.project.resolver(source) if self.project is not None else None
        self._shapes: dict[int, NotNone] = {}  # by the id of the function around a call (`_not_none`)

    def elsewhere(self, call: ast.Call, cls: ast.ClassDef | None) -> tuple[Target, tuple[Step, ...]] | None:
        """A function of another module (or a method inherited from one) that issues a collective, and the
        chain that shows it. Calls the index cannot resolve are unknown: None."""
        if self.resolver is None or self.project is None:
            return None
        local = self.resolve(call, cls)
        if local is not None and self.issues(local) is not None:
            return None  # found in this file
        found = self.resolver.callee(call.func, cls.name if cls else None, self._objects(call))
        if found is None:
            return None
        binding = self.project.call_binding(*found, call, self._not_none(call))
        chain = self.project.collective(found[0], binding)
        return (found[0], chain) if chain else None

    def chain(self, call: ast.Call, cls: ast.ClassDef | None) -> tuple[Step, ...] | None:
        """The whole chain from a call of a same-file function to its collective, from the index."""
        if self.resolver is None or self.project is None:
            return None
        found = self.resolver.callee(call.func, cls.name if cls else None, self._objects(call))
        if found is None:
            return None
        binding = self.project.call_binding(*found, call, self._not_none(call))
        chain = self.project.collective(found[0], binding)
        return (self.project.where(found[0]), *chain) if chain else None

    def _not_none(self, call: ast.Call) -> NotNone:
        """The names known not to be None in the function around `call`, read once per function (a long
        function has many calls, each asked several times by the rank-class walk)."""
        func = enclosing_function(self.source, call)
        found = self._shapes.get(id(func))
        if found is None:
            found = self._shapes[id(func)] = NotNone(func)
        return found

    def _objects(self, call: ast.Call) -> dict[str, Target] | None:
        """`distr.barrier()` with `distr = DistribTorch.instance()` in its function: the object's class."""
        func = call.func
        if self.resolver is None or not (isinstance(func, ast.Attribute) and isinstance(
                func.value, ast.Name)):
            return None
        return objects_at(self.source, self.resolver, call)

    def resolve(self, call: ast.Call, cls: ast.ClassDef | None) -> Function | None:
        func = call.func
        if isinstance(func, ast.Name):
            # a function its enclosing function defines runs here, where it is called (nested.py)
            local = self.nested.called(call, enclosing_function(self.source, call)) if self.nested else None
            if local is not None:
                self.owner.setdefault(local, cls)
                return local
            return self.module_functions.get(func.id)
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
            and cls
        ):
            return self.methods.get((cls.name, func.attr))
        return None

    def issues(self, func: Function) -> tuple[str, ast.Call] | None:
        """The first collective `func` may issue (its label and the call), or None. Iterative: a chain of
        thousands of functions costs its length, never a RecursionError; a cycle ends where it closes."""
        if func in self._memo:
            return self._memo[func]
        frames: list[tuple[Function, list[ast.Call], int]] = []

        def enter(f: Function) -> None:
            self._memo[f] = None  # while looking: a cycle back here finds nothing
            if rank_zero_decorator(f) is None:
                frames.append((f, list(branch_calls(f.body)), 0))

        enter(func)
        while frames:
            current, calls, i = frames[-1]
            if i >= len(calls):
                frames.pop()
                continue
            call = calls[i]
            label = self.labels.label(call)
            if label is not None:
                self._memo[current] = (label, call)
                frames.pop()
                continue
            target = self.resolve(call, self.owner.get(current))
            if target is not None and target not in self._memo:
                enter(target)
                continue
            inner = self._memo.get(target) if target is not None else None
            if inner is not None:
                self._memo[current] = inner
                frames.pop()
                continue
            frames[-1] = (current, calls, i + 1)
        return self._memo[func]

    def label(self, call: ast.Call, cls: ast.ClassDef | None) -> str | None:
        """The collective a call issues; for a function of this file that issues collectives, one token
        for all of them: role dispatch (`if rank == 0: serve() else: work()`) gives each rank its own
        function, and which collectives each makes is beyond a file-local check."""
        label = self.labels.label(call)
        if label is None:
            target = self.resolve(call, cls)
            if (
                target is not None
                and self.issues(target) is not None
                or self.elsewhere(call, cls) is not None
            ):
                label = HELPER
        return label

    def paths(self, stmts: list[ast.stmt], cls: ast.ClassDef | None, decide: Decide | None = None
              ) -> frozenset[tuple[str, ...]] | None:
        """Every sequence of collectives one pass through `stmts` can make (paths that raise drop out;
        `END` closes a path that returned). None when there are too many paths to compare. `decide` gives
        the value of a test for the ranks asked about (None: either): the other side of an `if` is no path
        of theirs, and an `assert` they fail raises."""
        result: set[tuple[str, ...]] = {()}
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                head = self._calls([stmt.test], cls)
                body, orelse = self.paths(stmt.body, cls, decide), self.paths(stmt.orelse, cls, decide)
                if body is None or orelse is None:
                    return None
                # `if not dist.is_initialized(): return` is decided the same way on every rank of a
                # distributed run: only the side that run takes is a path of it
                taken = _DISTRIBUTED_TESTS.test(stmt.test)
                if taken in (DISTRIBUTED, DISTRIBUTED.negated()):
                    body, orelse = (body, frozenset()) if taken == DISTRIBUTED else (frozenset(), orelse)
                known = decide(stmt.test) if decide is not None else None
                if known is not None:
                    body, orelse = (body, frozenset()) if known else (frozenset(), orelse)
                options = {head + p for p in body | orelse}
            elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                body = self.paths(stmt.body, cls, decide)
                if body is None:
                    return None
                options = {p for p in body if p[-1:] != (END,)} | {()}
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                inner = self.paths(stmt.body, cls, decide)
                if inner is None:
                    return None
                head = self._calls([item.context_expr for item in stmt.items], cls)
                options = {head + p for p in inner}
            elif isinstance(stmt, ast.Try):
                inner = self.paths(stmt.body + stmt.orelse, cls, decide)
                final = self.paths(stmt.finalbody, cls, decide)
                if inner is None or final is None:
                    return None
                # `finally:` runs after a `return` in the body too: its collectives come before the END
                options = {(p[:-1] + f + (END,)) if p[-1:] == (END,) else p + f for p in inner for f in final}
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            elif isinstance(stmt, ast.Raise) or isinstance(stmt, ast.Assert) and decide is not None and (
                    decide(stmt.test) is False):
                options = set()
            else:
                options = {self._calls([stmt], cls)}
                if isinstance(stmt, (ast.Return, ast.Continue, ast.Break)):
                    options = {p + (END,) for p in options}
            result = {a if a[-1:] == (END,) else a + b for a in result for b in options} if options else {
                a for a in result if a[-1:] == (END,)}
            if len(result) > MAX_PATHS:
                return None
        return frozenset(result)

    def _calls(self, nodes: list, cls: ast.ClassDef | None) -> tuple[str, ...]:
        return tuple(label for call in branch_calls(nodes) if (label := self.label(call, cls)) is not None)

    def balanced_by_rest(self, branch: ast.If, rest: list[ast.stmt], cls: ast.ClassDef | None) -> bool:
        """`if not main: barrier(); return` then, for the others, `try: ... finally: barrier()`: the ranks the
        branch sends away make the same collectives as those that go on through the rest of the block."""
        body, after = self.paths(branch.body, cls), self.paths(rest, cls)
        if body is None or after is None:
            return False
        body, after = frozenset(_unended(p) for p in body), frozenset(_unended(p) for p in after)
        return any(body) and body == after

    def balanced(self, branch: ast.If, cls: ast.ClassDef | None) -> bool:
        body = self.paths(branch.body, cls)
        orelse = self.paths(branch.orelse, cls)
        if body is None or orelse is None:
            flat = self._calls(branch.body, cls)
            return bool(flat) and flat == self._calls(branch.orelse, cls)
        if not any(p and p != (END,) for p in body | orelse):
            return False  # no collective on either side: nothing to balance (early exits still guard)
        return body == orelse


END = "<end>"


def _unended(path: tuple[str, ...]) -> tuple[str, ...]:
    return path[:-1] if path[-1:] == (END,) else path
# Reads what needs no names of a scope: `dist.is_initialized()`, `dist.is_available()`, launcher variables.
_DISTRIBUTED_TESTS = RankNames([])
HELPER = "<function issuing collectives>"
MAX_PATHS = 64
