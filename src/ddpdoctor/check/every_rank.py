"""Which functions of a file run on every rank: the question DDP601 asks before it calls a save a race.

A function runs on every rank when it is module-level code, is passed on by name by code that runs on
every rank (`mp.spawn(main)`), or
is called outside any one-writer rank guard from such a function — in this file (`Runner(...).fit()`,
`runner.fit()` with `runner = Runner(...)` here, `self.m()`), or from any other file of the project
(`ProjectIndex.every_rank_from_elsewhere`: `train()` called by another module's `main()`, which its
`if __name__ == "__main__":` block calls). A function only called under `if rank == 0:` runs on one
rank; one that nothing calls is left alone, unless its own rank test picks what one process does
(`if rank == 0: model.save_modules(...)` beside the save): code written for every rank, called from
outside the run or through a factory the checker does not follow. The walk is the shared one
(`walk.py`): iterative, a cycle counts as no.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from functools import cached_property

from .collectives import CollectiveCalls
from .facts import Target
from .guards import Function, GuardedCall
from .keyword_gates import KeywordGates
from .nested import nested_functions
from .rank_paths import SPAWNERS, enclosing_function, spawned_ranks
from .source import SourceFile, child_nodes, dotted, statements, walk
from .walk import first_answer, same


class EveryRank:
    """The functions of one file that run on every rank, asked one at a time (memoised)."""

    def __init__(self, source: SourceFile, calls: list[GuardedCall], *, lightning_hooks: bool = False,
                 not_run: frozenset[int] = frozenset()):
        """`not_run`: ids of the nodes of module-level code the program's processes never run (the
        `if __name__ == "__main__":` block of a module they only import): no entry point."""
        self.source = source
        self._calls = calls
        self.nested = nested_functions(source)
        # Lightning calls its hooks on every process it runs: where it runs several, they are entry points
        self.hooks = lightning_hook_methods(source) if lightning_hooks else frozenset()
        self.sites: dict[str, list[GuardedCall]] = {}
        self.owner: dict[Function, str] = {}
        callee_nodes = set()
        classes = {node.name for node in source.tree.body if isinstance(node, ast.ClassDef)}
        objects = {
            target.id
            for node in statements(source.tree.body)
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id in classes
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        # Functions that choose, with a rank test of their own, what one process does (`if rank == 0:
        # model.save_modules(...)`): code written to run on every rank, whoever calls it.
        self.rank_aware: dict[Function, int] = {}  # the line of its first such test
        self.rank_branches: dict[ast.If, Function] = {}  # the rank tests' `if`s, with their function
        for guarded in calls:
            if id(guarded.call) in not_run:
                continue
            if guarded.function is not None and guarded.cls is not None:
                self.owner[guarded.function] = guarded.cls.name
            guard = guarded.guard
            if guarded.function is not None and guard is not None and guard.branch is not None:
                self.rank_branches.setdefault(guard.branch, guarded.function)
            if guarded.function is not None and guard is not None and guard.one_writer_per_node and (
                    guard.branch is not None and not guard.early_exit):
                self.rank_aware.setdefault(guarded.function, guard.line)
            func = guarded.call.func
            name = func.id if isinstance(func, ast.Name) else (
                func.attr if isinstance(func, ast.Attribute) and (dotted(func.value) == "self" or _made_here(
                    func.value, classes, objects)) else None)
            if name:
                self.sites.setdefault(name, []).append(guarded)
                callee_nodes.add(id(func))
                if name in classes:  # `Saver(out)` runs `Saver.__init__` where the call runs
                    self.sites.setdefault(f"{name}.__init__", []).append(guarded)
        # Names used other than as a callee (`mp.spawn(main)`, `fw_compiler=saver`), with the functions they
        # are used in (None: module-level code). Passed on from module-level code, a function runs on every
        # rank; passed on inside a function, it runs where that function runs (an edge of the walk).
        self.referenced: dict[str, set[Function | None]] = {}
        stack: list[tuple[ast.AST, Function | None]] = [(source.tree, None)]
        while stack:
            node, within = stack.pop()
            if id(node) in not_run:
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                within = node
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and (
                    id(node) not in callee_nodes):
                self.referenced.setdefault(node.id, set()).add(within)
            stack.extend((child, within) for child in child_nodes(node))
        self._memo: dict[Function, bool | None] = {}
        # the functions found to run on every rank by their own rank test alone, with its line
        self.by_own_test: dict[Function, int] = {}
        self.by_collective: dict[Function, int] = {}  # the same, by a collective of its own outside any test

    @cached_property
    def keyword_gates(self) -> KeywordGates:
        return KeywordGates(self.source)

    @cached_property
    def collective_owners(self) -> dict[Function, int]:
        """Functions that issue a collective outside any rank test, with its line: code that every rank must
        run (or the job hangs), whoever calls it, a class made from a config string included."""
        labels = CollectiveCalls(self.source)
        found: dict[Function, int] = {}
        for guarded in self._calls:
            if guarded.guard is None and guarded.function is not None and labels.label(guarded.call):
                found.setdefault(guarded.function, guarded.call.lineno)
        return found

    @cached_property
    def maybe_guarded(self) -> set[int]:
        # (an `if` the flow read as a rank test is modelled by its guard's ranks, not guessed at)
        read = {id(branch) for branch in self.rank_branches}
        found = _maybe_rank_guarded(self.source.tree, self._no_rank_passed, read)
        for branch in self.rank_branches:  # `if save_states:` after `save_states = True` under a rank test
            flags = {target.id for node in walk(branch) if isinstance(node, ast.Assign)
                     for target in node.targets if isinstance(target, ast.Name)}
            if not flags:
                continue
            for node in walk(self.rank_branches[branch]):
                if isinstance(node, ast.If) and node is not branch and any(
                        isinstance(n, ast.Name) and n.id in flags for n in walk(node.test)):
                    found.update(id(n) for stmt in (*node.body, *node.orelse) for n in walk(stmt)
                                 if isinstance(n, ast.Call))
        return found

    def _no_rank_passed(self, func: Function, name: str) -> bool:
        """`name` is a parameter of `func` that the project's calls of `func` (one at least) fill with no
        rank value or test (`save_model(path, epoch + 1)`): comparing it with 0 is no rank test."""
        project = self.source.project
        params = [a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)]
        if project is None or name not in params:
            return False
        target = self.target(func)
        passed = project.attributes.arguments
        # (a nested function passed to a helper gets that helper's arguments: not known to be no rank)
        return any(site.passed_to is None for _, site in project.callers(target)) and (
            target, params.index(name)) not in passed

    def _class_of(self, func: Function) -> str | None:
        """The class of the file whose body defines `func` (a method), or None."""
        return next((name for name, cls in self.source.classes.items() if func in cls.body), None)

    def target(self, func: Function) -> Target:
        qualname = self.nested.names.get(func)  # `Runner.run.<locals>.one_step` for a nested function
        if qualname is not None:
            return Target(self.source.path, qualname)
        cls = self.owner.get(func)
        return Target(self.source.path, f"{cls}.{func.name}" if cls else func.name)

    def _passed_runs(self, func: Function) -> tuple[bool | None, list[Function]]:
        """A nested function passed to a project function runs where that function calls it (nested.py,
        resolved by the index): every rank when a caller of another file that runs on every rank passes it
        outside any rank test; otherwise where the functions of this file that pass it run."""
        project = self.source.project
        if project is None:
            return None, []
        edges: list[Function] = []
        for caller, site in project.callers(self.target(func)):
            if site.passed_to is None or site.guarded:
                continue
            if caller.path != self.source.path:
                if project.every_rank(caller):
                    return True, []
                continue
            node = self._by_name.get(caller.name)
            if node is not None:
                edges.append(node)
        return None, edges

    @cached_property
    def _by_name(self) -> dict[str, Function]:
        """The functions of this file by summary name (`f`, `Class.m`, `f.<locals>.g`)."""
        found: dict[str, Function] = {name: func for func, name in self.nested.names.items()}
        for node in self.source.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.setdefault(node.name, node)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found.setdefault(f"{node.name}.{item.name}", item)
        return found

    @cached_property
    def _spawn(self) -> tuple[frozenset[str], frozenset[Function]]:
        """The functions of the file `mp.spawn` starts (by name: each runs in every process it makes) and
        the functions that call it: the parent's, run once before and after its children (`main()` writing
        the run's config, then `mp.spawn(worker)`)."""
        text = self.source.text
        if "spawn" not in text and "start_processes" not in text:
            return frozenset(), frozenset()
        parents = {enclosing_function(self.source, call) for call in self.source.calls
                   if self.source.resolve(call.func) in SPAWNERS}
        return frozenset(spawned_ranks(self.source)), frozenset(f for f in parents if f is not None)

    def __call__(self, func: Function | None) -> bool:
        """Whether `func` (None: module-level code) runs on every rank."""
        if func is None:
            return True
        project = self.source.project

        spawned, parents = self._spawn

        def visit(f: Function) -> tuple[bool | None, list[Function]]:
            if f in self.hooks or f.name in spawned:
                return True, []
            if f in parents:
                return None, []  # the parent process, run once (and so is what it calls)
            referenced = self.referenced.get(f.name, set())
            passed: list[Function] = []
            if f in self.nested.parent:  # a nested function runs where it is called, not where it is named
                answer, passed = self._passed_runs(f)
                if answer:
                    return True, []
                referenced = set()
            if None in referenced or project is not None and project.every_rank_from_elsewhere(
                    self.target(f)):
                return True, []
            sites = self.sites.get(f.name, ()) if f.name != "__init__" else self.sites.get(
                f"{self._class_of(f)}.__init__", ())  # a constructor's calls, not every `__init__` named
            if f.decorator_list and (gate := self.keyword_gates(f)) is not None:
                sites = [s for s in sites if gate.runs(s.call)]  # each call's keyword decides
            if f in self.rank_aware and not sites and not referenced and f not in self.nested.parent and (
                    project is None or not project.callers(self.target(f))):
                self.by_own_test[f] = self.rank_aware[f]
                return True, []  # written to run on several ranks, and no caller of the run says otherwise
            if not sites and not referenced and f not in self.nested.parent and (
                    f in self.collective_owners and (project is None or not project.callers(self.target(f)))):
                self.by_collective[f] = self.collective_owners[f]
                return True, []  # its own collective, outside any rank test, needs every rank to call it
            callers = [s.function for s in sites
                       if (s.guard is None or not s.guard.one_writer_per_node)
                       and id(s.call) not in self.maybe_guarded]
            if None in callers:
                return True, []
            return None, [c for c in (*callers, *referenced, *passed) if c is not None and c is not f]

        walked: bool | None = first_answer(func, self._memo, visit, _itself, same)
        return bool(walked)


# The steps and the `on_*` hooks that Lightning's loops call on every process (Lightning 2.6.6
# `trainer/call.py`: `_call_lightning_module_hook` / `_call_callback_hooks` run in each process of the
# strategy). Not `prepare_data`, which runs on one process per node (`prepare_data_per_node`).
LIGHTNING_STEPS = frozenset({"training_step", "validation_step", "test_step", "predict_step", "setup",
                             "teardown", "configure_model", "training_epoch_end", "validation_epoch_end",
                             "test_epoch_end"})
LIGHTNING_BASES = frozenset({"LightningModule", "Callback", "LightningDataModule"})


def lightning_hook_methods(source: SourceFile) -> frozenset[Function]:
    """The hook methods of this file's classes that derive from a Lightning module, callback or data module
    (directly, or through a class of this file that does)."""
    lightning: set[str] = set()
    classes = [node for node in statements(source.tree.body) if isinstance(node, ast.ClassDef)]
    changed = True
    while changed:  # a base class of this file that derives from Lightning's, at any depth
        changed = False
        for cls in classes:
            if cls.name in lightning:
                continue
            for base in cls.bases:
                qual = source.resolve(base) or ""
                if ("lightning" in qual and qual.rsplit(".", 1)[-1] in LIGHTNING_BASES) or (
                        isinstance(base, ast.Name) and base.id in lightning):
                    lightning.add(cls.name)
                    changed = True
                    break
    return frozenset(
        item for cls in classes if cls.name in lightning for item in cls.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (item.name.startswith("on_") or item.name in LIGHTNING_STEPS)
    )


def _maybe_rank_guarded(tree: ast.Module, plain: Callable[[Function, str], bool], read: set[int]) -> set[int]:
    """ids of the calls under an `if` that may be a rank test the checker cannot read: a name or attribute
    of unknown origin compared with 0 or -1 (`if self.device_id <= 0:`, `if gpu == 0:`), and of the calls
    after one that lets some ranks leave the block (`if rank != 0: return`). Evidence that a
    save runs on every rank must not run through one: unknown is not "every rank". A parameter that every
    known caller fills with something else (`plain`) has a known origin."""
    found: set[int] = set()
    # `covered`: under an `if` already found, whose calls, these included, are all in `found`
    stack: list[tuple[ast.AST, Function | None, bool]] = [(tree, None, False)]
    while stack:
        node, func, covered = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node
        elif not covered and isinstance(node, ast.If) and id(node) not in read and _may_test_rank(
                node.test, func, plain):
            found.update(id(n) for stmt in (*node.body, *node.orelse) for n in walk(stmt)
                         if n.__class__ is ast.Call)
            covered = True
        if not covered:  # `if rank != 0: return` (a maybe-rank test letting some leave): the rest
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if not isinstance(block, list):
                    continue
                for i, stmt in enumerate(block):
                    if isinstance(stmt, ast.If) and id(stmt) not in read and stmt.body and isinstance(
                            stmt.body[-1], _EXITS) and _may_test_rank(stmt.test, func, plain):
                        found.update(id(n) for rest in block[i + 1:] for n in walk(rest)
                                     if n.__class__ is ast.Call)
                        break
        stack.extend((child, func, covered) for child in child_nodes(node))
    return found


_EXITS = (ast.Return, ast.Continue, ast.Break)  # (a `raise` is a crash, not a leave: its rank is no writer)


def _may_test_rank(test: ast.expr, func: Function | None, plain: Callable[[Function, str], bool]) -> bool:
    for node in walk(test):
        if isinstance(node, ast.Compare) and isinstance(node.left, (ast.Name, ast.Attribute)) and any(
                isinstance(c, ast.Constant) and c.value in (0, -1) and not isinstance(c.value, bool)
                for c in node.comparators) and not (
                isinstance(node.left, ast.Name) and func is not None and plain(func, node.left.id)):
            return True
    return False


def _made_here(receiver: ast.expr, classes: set[str], objects: set[str]) -> bool:
    """An object of a class of this file: `Runner(...)` itself, or a name bound to one here."""
    if isinstance(receiver, ast.Call):
        return isinstance(receiver.func, ast.Name) and receiver.func.id in classes
    return isinstance(receiver, ast.Name) and receiver.id in objects


def _itself(caller: Function) -> Function:
    return caller
