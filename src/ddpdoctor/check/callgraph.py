"""The call graph of the run: functions looked up across re-exports, star imports and base classes, and
facts followed through calls and parameters. Every walk is iterative, memoised and cycle-safe, so a
10,000-deep chain or two modules importing each other cost what their size costs, and nothing recurses."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from .constant_gates import Binding, gated, given_constants, parameter_index, passed
from .facts import SUPER, CallSite, FunctionSummary, ModuleSummary, Step, Target
from .helper_tests import settled
from .index import ProjectFiles, Resolver
from .module_graph import ModuleGraph
from .scope import MODULE
from .scripts import block_is_distributed, in_main_block
from .walk import first_answer, same

if TYPE_CHECKING:
    from .attributes import AttributeRanks
    from .source import SourceFile
    from .summaries import Returned

MAX_ALIAS_HOPS = 8
_Found = TypeVar("_Found")  # what a walk through parameters looks for


class CallGraph(ModuleGraph):
    """The summaries of every module of the run, and the walks over their calls."""

    def __init__(self, summaries: Iterable[ModuleSummary], files: ProjectFiles):
        self.files = files
        self._resolver: tuple[ast.Module, Resolver] | None = None
        self._called: dict[Target, set[str]] | None = None
        self._callers: dict[Target, list[tuple[Target, CallSite]]] | None = None
        self._every_rank: dict[Target, bool | None] = {}
        self._importers: dict[str, set[str]] | None = None
        self._builders: bool | None = None
        self.modules: dict[str, ModuleSummary] = {s.path: s for s in summaries}
        self._memo: dict[str, dict[Target, tuple[Step, ...] | None]] = {}
        self._components: dict[str, int] | None = None
        self._members: dict[int, list[ModuleSummary]] = {}
        self._classes: dict[str, frozenset[str]] = {}
        self._tensor_takers: dict[Target, bool] | None = None
        self._any_takers: bool | None = None
        self._returned: dict[Target, Returned | None] = {}
        self._any_returned: bool | None = None
        self._attributes: AttributeRanks | None = None
        self._managed: dict[str, dict[str, tuple[str, Step]]] | None = None  # ProjectIndex.built_by_managed
        self._flags: tuple[int, frozenset[str]] | None = None  # (modules counted, flags never raised)
        self.distributed_blocks: dict[str, bool] = {}  # scripts.block_is_distributed, memoised
        for path, module in self.modules.items():  # (the index is whole here: a helper of any file)
            if module.passes_closures or module.helper_tested:
                self.modules[path] = settled(self, module)

    def resolver(self, source: SourceFile) -> Resolver:
        """The call resolver of the file being checked (made once per file, shared by the summary and
        the rules)."""
        if self._resolver is None or self._resolver[0] is not source.tree:
            self._resolver = (source.tree, Resolver(source, self.files))
        return self._resolver[1]

    def add(self, summary: ModuleSummary) -> None:
        """One more module (the file being read, into its own index in the first pass); what was asked
        while its summary was made (before it was in) is asked again."""
        self.modules[summary.path] = settled(self, summary)
        self._memo, self._classes, self._returned, self._any_returned = {}, {}, {}, None
        self._components, self._members, self._attributes = None, {}, None
        self.__dict__.pop("_rank_test_methods", None)
        self.__dict__.pop("_rank_functions", None)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_resolver"] = None  # an AST is not for other processes
        return state

    # -- functions ---------------------------------------------------------------------------------
    def function(self, target: Target) -> tuple[Target, FunctionSummary] | None:
        """The summary of a function, following re-exports and methods inherited from project base classes:
        the first base defining it, left to right and depth first (Python's order unless two bases share a
        base: `class Run(Hooks, Base)` finds `Base.load`). `Cls.__super__.m` (`super().m()`) skips `Cls`."""
        pending = [(target, MAX_ALIAS_HOPS)]  # (a place the function may be, hops left): tried in order
        while pending:
            target, hops = pending.pop()
            module = self.modules.get(target.path)
            if module is None or hops <= 0:
                continue
            found = module.functions.get(target.name)
            if found is not None:
                return target, found
            if "()." in target.name:  # `t = Trainer.from_config(cfg)` then `t.run()`: what the factory makes
                factory, _, member = target.name.partition("().")
                made = self._made_by(Target(target.path, factory), member)
                if made is not None:
                    pending.append((Target(made.path, f"{made.name}.{member}"), hops - 1))
                continue
            cls, _, method = target.name.partition(".")
            if method:
                method = method.removeprefix(SUPER)
                bases = module.functions.get(f"{cls}.__bases__")
                if bases is None or not bases.calls:
                    # `from .trainer import Trainer` (or a package `__init__` re-exporting the class): the
                    # method is in the one imported module that defines the class
                    home = self._class_home(target.path, cls)
                    following = Target(home, target.name) if home is not None else self._reexport(target)
                    if following is not None:
                        pending.append((following, hops - 1))
                    continue
                pending.extend((Target(site.target.path, f"{site.target.name}.{method}"), hops - 1)
                               for site in reversed(bases.calls))  # (the leftmost base popped first)
                continue
            if cls in self._classes_of(module):  # `Writer(...)`: a call of its `__init__` (and what it calls)
                pending.append((Target(target.path, f"{cls}.__init__"), hops - 1))
                continue
            following = self._reexport(target)
            if following is not None:
                pending.append((following, hops - 1))
        return None

    def _class_home(self, path: str, cls: str) -> str | None:
        """The one module imported by `path` that defines class `cls`, where `path` itself does not."""
        module = self.modules[path]
        if cls in self._classes_of(module):
            return None
        holders = [p for p in module.imports if p in self.modules and p != path
                   and cls in self._classes_of(self.modules[p])]
        return holders[0] if len(holders) == 1 else None

    def _classes_of(self, module: ModuleSummary) -> frozenset[str]:
        """The classes a module defines a method of (the `Class.` of its functions' names), listed once."""
        found = self._classes.get(module.path)
        if found is None:
            found = self._classes[module.path] = frozenset(
                name.split(".", 1)[0] for name in module.functions if "." in name)
        return found

    def _made_by(self, factory: Target, member: str) -> Target | None:
        """The class whose object a factory returns, for reading `member` on it: the class it is called on
        for `return cls(...)` (a subclass inheriting the factory included), a class its file holds by name.
        Where it may make one of several classes, the first (by name) that has `member` (a may-answer:
        the object is one of them)."""
        found = self.function(factory)
        if found is None or not found[1].returns_classes:
            return None
        if found[1].returns_classes == ("cls",):
            return Target(factory.path, factory.name.rsplit(".", 1)[0])
        made = [Target(found[0].path, name) for name in found[1].returns_classes if name != "cls"]
        if len(made) == 1:
            return made[0]
        return next((cls for cls in made if "()" not in member and self.function(
            Target(cls.path, f"{cls.name}.{member}")) is not None), None)

    def _reexport(self, target: Target) -> Target | None:
        """`from .core import train` in a package's `__init__`: where `train` really is."""
        module = self.modules.get(target.path)
        if module is None:
            return None
        holders = [
            p for p in module.imports if p in self.modules and target.name in self.modules[p].functions
        ]
        if len(holders) == 1:
            return Target(holders[0], target.name)
        if holders or not module.stars:
            return None
        # `from pkg import *` where `pkg/__init__.py` does `from .misc import *`: breadth-first, bounded.
        seen = {target.path}
        frontier = list(module.stars)
        for _ in range(MAX_ALIAS_HOPS):
            found = [p for p in frontier if p in self.modules and target.name in self.modules[p].functions]
            if found:
                return Target(found[0], target.name)
            seen.update(frontier)
            frontier = [q for p in frontier if p in self.modules for q in self.modules[p].stars
                        if q not in seen]
            if not frontier:
                break
        return None

    @property
    def attributes(self) -> AttributeRanks:
        """The project's attributes in the rank domain (`attributes.py`), joined once per run."""
        if self._attributes is None or self._attributes.size != len(self.modules):
            from .attributes import AttributeRanks  # (made again once the first pass adds its file)

            self._attributes = AttributeRanks(self)
        return self._attributes

    def returned(self, target: Target) -> Returned | None:
        """What `target` returns in the rank domain, following `return helper()` links (bounded; a cycle
        gives nothing)."""
        memo = self._returned
        if target in memo:
            return memo[target]
        memo[target] = None
        current: Target | None = target
        chain: list[Returned] = []  # the links followed, outermost first
        answer: Returned | None = None
        while current is not None and len(chain) < MAX_ALIAS_HOPS:
            found = self.function(current)
            shape = found[1].returned if found is not None else None
            if shape is None or shape.through is None:
                answer = shape
                break
            chain.append(shape)
            current = shape.through
            if current in memo:  # known already, or a cycle (None)
                answer = memo[current]
                break
        for link in reversed(chain):  # `return node_index() == 0` once `node_index()` is known
            answer = link.resolved(answer)
        memo[target] = answer
        return answer

    # -- transitive facts ----------------------------------------------------------------------------
    def collective(self, target: Target, binding: Binding = ()) -> tuple[Step, ...] | None:
        """The chain from `target` to a collective it may issue, at any depth, or None. `binding`: parameters
        (index, `self` counted) the call fixes to a literal (`make_loader(path, rank=-1)`, or a default it
        leaves alone): what those constants turn off does not run (constant_gates.py), down the chain."""
        memo: dict[tuple[Target, Binding], tuple[Step, ...] | None] = self._memo.setdefault(  # type: ignore
            "collective", {})
        Edge = tuple[CallSite, Binding]

        def visit(node: tuple[Target, Binding]) -> tuple[tuple[Step, ...] | None, list[Edge]]:
            at, fixed = node
            found = self.function(at)
            if found is None or found[1].rank_zero_only:
                return None, []
            summary = found[1]
            quiet, unreached = gated(summary, fixed)
            if summary.collective is not None and not quiet:
                return (summary.collective,), []
            return None, [(site, self.passed(site, fixed)) for site in summary.calls
                          if site.line not in unreached]

        def extend(_node: tuple[Target, Binding], edge: Edge, inner: tuple[Step, ...]) -> tuple[Step, ...]:
            path, line = self._where(edge[0].target)
            return (Step(f"`{edge[0].target.name}()`", path, line), *inner)

        return first_answer((target, binding), memo, visit, lambda edge: (edge[0].target, edge[1]), extend)

    def call_binding(self, target: Target, bound: bool, call: ast.Call,
                     not_none: Callable[[ast.expr], bool] | None = None) -> Binding:
        """What a call of the file being checked fixes in `target`'s parameters (`passed`, for one call)."""
        constants, arity = given_constants(call, not_none)
        return self.passed(CallSite(target, call.lineno, False, bound, (), (), constants, arity), ())

    def passed(self, site: CallSite, fixed: Binding) -> Binding:
        """The callee's parameters a call fixes to constants (`constant_gates.passed`)."""
        found = self.function(site.target)
        return passed(site, fixed, found[1]) if found is not None else ()

    def saves(self, target: Target) -> tuple[Step, ...] | None:
        """The chain from `target` to a `torch.save` to a shared path that runs on every rank calling it."""
        return self._search("save", target, lambda f: f.save, lambda site: not site.guarded,
                            stop=lambda f: f.rank_zero_only)

    def _search(self, fact: str, start: Target, direct: Callable[[FunctionSummary], Step | None],
                follow: Callable[[CallSite], bool], stop: Callable[[FunctionSummary], bool]
                ) -> tuple[Step, ...] | None:
        """The chain from `start` down its calls to a function that does `direct` itself (the shared walk)."""

        def visit(target: Target) -> tuple[tuple[Step, ...] | None, list[CallSite]]:
            found = self.function(target)
            if found is None or stop(found[1]) or fact == "save" and found[0].name.endswith(
                    ".__init__") and not target.name.endswith(".__init__"):
                return None, []  # a constructor's writes are not followed from `Cls(...)` (collectives are)
            step = direct(found[1])
            return ((step,), []) if step is not None else (None, [s for s in found[1].calls if follow(s)])

        def extend(_target: Target, site: CallSite, inner: tuple[Step, ...]) -> tuple[Step, ...]:
            path, line = self._where(site.target)
            return (Step(f"`{site.target.name}()`", path, line), *inner)

        return first_answer(start, self._memo.setdefault(fact, {}), visit, lambda site: site.target, extend)

    def every_rank_from_elsewhere(self, target: Target) -> bool:
        """`target` is called outside any rank test by a function of another file that runs on every rank
        (the calls of its own file are for the caller to judge, with the rank tests it reads there; a caller
        that Lightning or accelerate drive is no evidence: they save from one rank themselves)."""
        return any(not site.guarded and caller.path != target.path
                   and not self.modules[caller.path].framework
                   and (self._program_code(caller, site) if caller.name == MODULE
                        else self.every_rank(caller))
                   for caller, site in self.callers(target))

    def every_rank(self, target: Target) -> bool:
        """`target` runs on every rank of the program: some file's module-level code calls it outside any rank
        test, or a function that runs on every rank does (in any file, at any depth; a caller decorated
        `@rank_zero_only` runs on one rank). A function no file calls is not known to run at all."""

        def visit(at: Target) -> tuple[bool | None, list[Target]]:
            edges: list[Target] = []
            module = self.modules.get(at.path)
            if module is not None and any(name == at.name and (not in_main_block(module, line) or (
                    block_is_distributed(self, at.path, self.distributed_blocks)))
                    for name, line in module.handed_on):
                return True, []  # `fire.Fire(main)` in the program's module-level code
            for caller, site in self.callers(at):
                if site.guarded:
                    continue
                if caller.name == MODULE:
                    if self._program_code(caller, site):
                        return True, []
                    continue
                found = self.function(caller)
                if found is not None and not found[1].rank_zero_only:
                    edges.append(caller)
            return None, edges

        walked: bool | None = first_answer(target, self._every_rank, visit, _itself, same)
        return bool(walked)

    def _program_code(self, caller: Target, site: CallSite) -> bool:
        """Module-level code the program's processes run: not a one-process script's block (scripts.py)."""
        if not in_main_block(self.modules[caller.path], site.line):
            return True
        return block_is_distributed(self, caller.path, self.distributed_blocks)

    def callers(self, target: Target) -> list[tuple[Target, CallSite]]:
        """The call sites of the run that call `target` (resolved through re-exports and base classes), with
        the function each is in (`<module>` for a file's top-level code)."""
        if self._callers is None:
            self._callers = {}
            for m in self.modules.values():
                for f in m.functions.values():
                    for site in f.calls:
                        found = self.function(site.target)
                        if found is not None:
                            self._callers.setdefault(found[0], []).append((Target(m.path, f.name), site))
        return self._callers.get(target, [])

    def called(self, target: Target, elsewhere: bool = False) -> bool:
        """Some function of the run calls `target` (with `elsewhere`: some function of another file)."""
        if self._called is None:
            self._called = {}
            for m in self.modules.values():
                for f in m.functions.values():
                    for site in f.calls:
                        self._called.setdefault(site.target, set()).add(m.path)
        callers = self._called.get(target, set())
        return bool(callers - {target.path}) if elsewhere else bool(callers)


    def _follow_parameter(
        self,
        target: Target,
        argument: int | str,
        bound: bool,
        visit: Callable[[Target, FunctionSummary, int, tuple[Step, ...]], _Found | None],
    ) -> _Found | None:
        """Breadth-first from calling `target` with a value in `argument`, through every project function the
        value is passed on to unchanged (each (function, parameter) pair once): the first answer `visit`
        gives, with the chain of calls that led there."""
        found = self.function(target)
        if found is None:
            return None
        index = self._parameter(found[1], argument, bound)
        if index is None:
            return None
        seen: set[tuple[Target, int]] = set()
        queue: list[tuple[Target, FunctionSummary, int, tuple[Step, ...]]] = [(found[0], found[1], index, ())]
        while queue:
            target, summary, index, path = queue.pop(0)
            if (target, index) in seen or len(seen) > 10_000:
                continue
            seen.add((target, index))
            here = (*path, Step(f"`{target.name}()`", target.path, summary.line))
            answer = visit(target, summary, index, here)
            if answer is not None:
                return answer
            for site in summary.calls:
                for arg, caller_param in site.flows:
                    if caller_param != index:
                        continue
                    callee = self.function(site.target)
                    if callee is None:
                        continue
                    callee_param = self._parameter(callee[1], arg, site.bound)
                    if callee_param is not None:
                        queue.append((callee[0], callee[1], callee_param, here))
        return None

    @staticmethod
    def _parameter(summary: FunctionSummary, argument: int | str, bound: bool) -> int | None:
        return parameter_index(summary.params, argument, bound)

    def where(self, target: Target) -> Step:
        """The definition of a function, as the first step of a chain: `train()` (main.py:26)."""
        path, line = self._where(target)
        return Step(f"`{target.name.rsplit('.', 1)[-1]}()`", path, line)

    def _where(self, target: Target) -> tuple[str, int]:
        found = self.function(target)
        return (found[0].path, found[1].line) if found else (target.path, 0)


def _itself(target: Target) -> Target:
    return target

