"""The project index: what each module's functions do, summarised once per run, and the facts that follow.

`ddpdoctor check` reads every file twice at most: a first pass parses each file and keeps a small
`ModuleSummary` (its project imports, and for each function: the collective it issues, the checkpoint it
writes, the parameters it iterates, the project functions it calls and which of its parameters flow into
them). No AST outlives its pass. The summaries are merged into a `ProjectIndex`, which the rules that look
across functions and files ask, in the second pass, for transitive facts with the chain of calls that
proves them ("`train()` (main.py:26) → `for … in loader` (main.py:28)").

A call the index cannot resolve (dynamic dispatch, `getattr`, a library) is unknown: never evidence.
Every walk over the call graph is iterative, memoised and cycle-safe, so a 10,000-deep chain or two
modules importing each other cost what their size costs, and nothing recurses.

The index is split by concern: `facts.py` (the data), `index.py` (imports and calls resolved to project
files), `summarize.py` (the first pass), `loaders.py` and `summaries.py` (what is followed while
summarising), `callgraph.py` (the walks), and this module: the queries the rules ask.
"""

from __future__ import annotations

from collections.abc import Callable

from .callgraph import MAX_ALIAS_HOPS, CallGraph
from .facts import BackendInit, CallSite, FunctionSummary, ModuleSummary, Step, Target, show_chain  # noqa: F401
from .flags import never_raised
from .flows import same_place, suffix_after
from .index import ProjectFiles, Resolver  # noqa: F401
from .loaders import bound_paths, distributed_loader, held_loaders, sampler_entries, shuffling_sampler  # noqa: F401
from .second_pass import needs_project
from .summarize import COLLECTIVE_WORDS, TENSOR_ARGS, guarded_calls, runs_epochs_for_you, summarize  # noqa: F401
from .writes import is_buffer, looks_like_path  # noqa: F401

__all__ = ["MAX_ALIAS_HOPS", "BackendInit", "CallSite", "FunctionSummary", "ModuleSummary", "ProjectFiles",
           "ProjectIndex", "Resolver", "Step", "Target", "bound_paths", "distributed_loader", "held_loaders",
           "shuffling_sampler", "show_chain", "COLLECTIVE_WORDS", "TENSOR_ARGS", "guarded_calls", "is_buffer",
           "looks_like_path", "runs_epochs_for_you", "summarize"]


class ProjectIndex(CallGraph):
    """The facts the rules ask of the whole run, on top of the call graph."""

    def has_builders(self) -> bool:
        if self._builders is None:
            self._builders = any(
                f.returns_loader for m in self.modules.values() for f in m.functions.values()
            )  # (a builder that forwards to another needs that other one)
        return self._builders


    @property
    def has_metric_classes(self) -> bool:
        """Some module of the run defines a class deriving from a torchmetrics class."""
        return any(module.metric_classes for module in self.modules.values())

    def metric_class(self, target: Target) -> bool:
        """Whether a project class (as a call resolves it) derives from a torchmetrics class: in its own
        module, re-exported by a package, or through project base classes in other files."""
        seen = 0
        while seen < MAX_ALIAS_HOPS:
            seen += 1
            module = self.modules.get(target.path)
            if module is None or "." in target.name:
                return False
            if target.name in module.metric_classes:
                return True
            bases = module.functions.get(f"{target.name}.__bases__")
            if bases is not None and bases.calls:
                target = bases.calls[0].target
                continue
            following = self._reexport_class(target)
            if following is None:
                return False
            target = following
        return False

    def _reexport_class(self, target: Target) -> Target | None:
        """The one module `target.path` imports that defines class `target.name` as a metric class."""
        module = self.modules[target.path]
        holders = [p for p in module.imports if p in self.modules and p != target.path
                   and target.name in self.modules[p].metric_classes]
        return Target(holders[0], target.name) if len(holders) == 1 else None

    def built_by_managed(self, path: str) -> dict[str, tuple[str, Step]]:
        """The constructors of `path` (`Class.__init__`) that run when a LightningModule or a DDP-wrapped
        class (any file) builds an object, directly in one of its methods or in a constructor that one of
        them runs: each with the managing class and where the chain starts (DDP402)."""
        if self._managed is None:
            self._managed = self._managed_constructors()
        return self._managed.get(path, {})

    def _managed_constructors(self) -> dict[str, dict[str, tuple[str, Step]]]:
        found: dict[Target, tuple[str, Step]] = {}
        frontier: list[tuple[Target, str, Step | None]] = [
            (Target(m.path, name), cls, None) for m in self.modules.values() for cls in m.device_managed
            for name in m.functions if name.startswith(f"{cls}.")]
        while frontier:
            at, owner, start = frontier.pop()
            found_at = self.function(at)
            if found_at is None:
                continue
            for site in found_at[1].calls:
                if "." in site.target.name or not site.target.name[:1].isupper():
                    continue
                made = self.function(Target(site.target.path, f"{site.target.name}.__init__"))
                if made is None or made[0] in found:
                    continue
                step = start or Step(f"`{site.target.name}(...)`", found_at[0].path, site.line)
                if made[0].name.split(".", 1)[0] in self.modules[made[0].path].device_managed:
                    continue  # read as a managed class itself
                found[made[0]] = (owner, step)
                frontier.append((made[0], owner, step))
        by_path: dict[str, dict[str, tuple[str, Step]]] = {}
        for target, value in found.items():
            by_path.setdefault(target.path, {})[target.name] = value
        return by_path

    @property
    def never_raised_flags(self) -> frozenset[str]:
        """Attributes the project declares as flags (`self.stop = False`) and never sets otherwise (made
        again once the first pass adds a file: its own summary runs the rank walk before it is added)."""
        size = len(self.modules)
        if self._flags is None or self._flags[0] != size:
            self._flags = (size, never_raised(m.flags for m in self.modules.values()))
        return self._flags[1]

    def returns_loader(self, target: Target) -> tuple[tuple[Step, ...], tuple[str, ...]] | None:
        """`build_loader()` (any module): the chain to its `return DataLoader(..., sampler=...)`, and where
        the loader is in what it returns ("" itself, `[0]` in a tuple, `['train']` in a dict)."""
        steps: list[Step] = []
        for _ in range(MAX_ALIAS_HOPS):  # `return create_loaders(...)`: through builders that forward
            found = self.function(target)
            if found is None:
                return None
            steps.append(self.where(found[0]))
            if found[1].returns_loader is not None:
                return (*steps, found[1].returns_loader), found[1].loader_suffixes or ("",)
            if found[1].forwards is None:
                return None
            target = found[1].forwards
        return None

    def loader_parameters(self, target: Target, _seen: frozenset[Target] = frozenset()
                          ) -> list[tuple[int, str, tuple[Step, ...]]]:
        """The parameters of `target` that some caller fills with a loader a builder returned (`loaders =
        build(cfg)` then `fit(model, loaders)`, or `fit(loaders={"train": loader})`, any files), or with
        its own parameter that its callers fill so (`Pipeline(train=loaders["train"])` in `build(loaders)`),
        at any depth: (parameter, where the loader is in it, the chain from the caller to the builder's
        `return`). Memoised; a cycle of callers adds nothing."""
        memo: dict[Target, list] = self.__dict__.setdefault("_loader_parameters", {})
        found = self.function(target) if self.has_builders() and target not in _seen else None
        if found is None or found[0] in memo:
            return memo.get(found[0], []) if found is not None else []
        out: list[tuple[int, str, tuple[Step, ...]]] = []
        sites = [(caller, site, site.bound) for caller, site in self.callers(found[0])]
        sites += [(caller, site, True) for caller, site in self.constructions(found[0])]
        for caller, site, bound in sites:
            here = Step(f"`{caller.name.rsplit('.', 1)[-1]}()` passes it", caller.path, site.line)
            held = [(argument, "", builder, taken) for argument, builder, taken in site.results]
            for argument, within, builder, taken in [*held, *site.placed]:
                made = self.returns_loader(builder)
                index = self._parameter(found[1], argument, bound)
                if made is not None and index is not None:
                    out += [(index, within + suffix[len(taken):], (here, *made[0]))
                            for suffix in made[1] if suffix.startswith(taken)]
            for argument, param, part in site.parts:  # the caller's own parameter, filled by its callers
                index = self._parameter(found[1], argument, bound)
                out += [(index, rest[len(part):], (here, *chain)) for given, rest, chain in
                        self.loader_parameters(caller, _seen | {found[0]})
                        if index is not None and given == param and rest.startswith(part)]
        if not _seen:
            memo[found[0]] = out
        return out

    def constructions(self, init: Target) -> list[tuple[Target, CallSite]]:
        """The calls of the run that construct the class whose `__init__` is `init` (`Trainer(model, loader)`,
        any file): they fill its parameters after `self` (made once)."""
        if not init.name.endswith(".__init__"):
            return []
        made: dict[Target, list[tuple[Target, CallSite]]] | None = self.__dict__.get("_constructions")
        if made is None:
            made = {}
            for module in self.modules.values():
                for function in module.functions.values():
                    for site in function.calls:
                        registry = self.function(site.target) if site.target.name.endswith("[]") else None
                        for cls in [s.target for s in registry[1].calls] if registry else [site.target]:
                            if cls.name[:1].isupper() and "." not in cls.name and (
                                    found := self.function(Target(cls.path, f"{cls.name}.__init__"))):
                                caller = Target(module.path, function.name)
                                made.setdefault(found[0], []).append((caller, site))
            self.__dict__["_constructions"] = made
        return made.get(init, [])

    def parameter_method(self, function: Target, parameter: int, method: str) -> Target | None:
        """`handler.save(...)` where `handler` is parameter `parameter` of `function`: the method, when the
        callers that pass a known object (`h = Handler(dir)`, then `train(model, h)` or `train(...,
        handler=h)`, any files) all pass one of the same project class."""
        found = self.function(function)
        if found is None:
            return None
        classes: set[Target] = set()
        for _caller, site in self.callers(found[0]):
            for argument, made, taken in site.results:
                if (not taken and made.name[:1].isupper() and "." not in made.name
                        and self._parameter(found[1], argument, site.bound) == parameter):
                    classes.add(made)
        if len(classes) != 1:
            return None
        cls = classes.pop()
        return Target(cls.path, f"{cls.name}.{method}")

    def iterates(self, target: Target, argument: int | str, bound: bool, suffix: str = ""
                 ) -> tuple[Step, ...] | None:
        """The chain from calling `target` with a loader in `argument` (at `suffix` in it: `['train']` when
        a dict of loaders is passed) to a `for` loop over it."""

        def loop_over_it(at: Target, summary: FunctionSummary, index: int, here: tuple[Step, ...]
                         ) -> tuple[Step, ...] | None:
            for param, taken, line in summary.iterates:
                if param == index and same_place(taken, suffix):
                    return (*here, Step(f"`for … in {summary.params[param]}{taken}`", at.path, line))
            for param, wrap, position, line in summary.iterates_via if not suffix else ():
                given = self.function(wrap)
                if param == index and given is not None and position in given[1].passes_through:
                    shown = f"`for … in {wrap.name.rsplit('.', 1)[-1]}({summary.params[param]}, …)`"
                    return (*here, Step(shown, at.path, line))
            return None

        return self._follow_parameter(target, argument, bound, loop_over_it)


    def epoch_loop(self, cls: Target, argument: int | str, suffix: str = "") -> tuple[Step, ...] | None:
        """Constructing the project class `cls` with a loader in `argument` (at `suffix` in it): the chain
        to an epoch loop of the class over it (`Trainer.run()`'s `while True` → `self.train_epoch()` →
        `for … in self.loaders['train']`)."""
        found = self.function(Target(cls.path, f"{cls.name}.__init__"))
        if found is None or not found[1].epoch_params:
            return None
        index = self._parameter(found[1], argument, True)
        if any(param == index for param, _, _ in self.loader_parameters(found[0])):
            return None  # a builder's loader: the class's own file reports it at its epoch loop (_passed_in)
        for param, taken, chain in found[1].epoch_params:
            if param == index and same_place(taken, suffix):
                return (Step(f"`{cls.name}.__init__()` keeps it", found[0].path, found[1].line), *chain)
        return None

    def object_iterates(self, method: Target, argument: int | str, suffix: str) -> tuple[Step, ...] | None:
        """`t = Trainer(model, loader)` then `t.train_epoch()`: whether that method iterates (itself or
        through
        `self.m()` calls) what the constructor kept from `argument` (at `suffix` in it); the chain."""
        cls, _, _ = method.name.rpartition(".")
        init = self.function(Target(method.path, f"{cls}.__init__"))
        found = self.function(method)
        if init is None or found is None or not init[1].keeps or not found[1].self_iterates:
            return None
        index = self._parameter(init[1], argument, True)
        for attr, param in init[1].keeps:
            if param != index:
                continue
            for walked, chain in found[1].self_iterates:
                if suffix_after(walked, attr) == suffix:
                    return (
                        Step(f"`{cls}.__init__()` keeps it", init[0].path, init[1].line),
                        self.where(found[0]),
                        *chain,
                    )
        return None

    def returns_wrapper(self, target: Target) -> str | None:
        """The model wrapper `target` may return (model_wrappers.Wrapper's value), or None."""
        found = self.function(target)
        return found[1].returns_wrapper if found is not None else None

    def runs_parameter(self, target: Target, argument: int | str, bound: bool) -> bool:
        """`target` runs a pass (`p(x)`, `p.forward`, `p.generate`) of what the call gives as `argument`,
        itself or in a project function it hands the parameter on to (`evaluate(model)` calling
        `losses(model, batch)`), at any depth (memoised; a cycle answers no)."""
        found = self.function(target)
        if found is None:
            return False
        index = self._parameter(found[1], argument, bound)
        return index is not None and self._runs(found[0], index)

    def _runs(self, target: Target, index: int) -> bool:
        memo: dict[tuple[Target, int], bool] = self.__dict__.setdefault("_runs_memo", {})
        key = (target, index)
        if key not in memo:
            memo[key] = False  # while it is being answered: a cycle
            found = self.function(target)
            summary = found[1] if found is not None else None
            memo[key] = summary is not None and (index in summary.runs_params or any(
                (inner := self.function(site.target)) is not None
                and (parameter := self._parameter(inner[1], given, site.bound)) is not None
                and self._runs(inner[0], parameter)
                for site in summary.calls for given, passed in site.flows if passed == index))
        return memo[key]

    def returns_cpu(self, target: Target) -> tuple[Step, ...] | None:
        """`make_counts()` (any module) returns a CPU tensor on every path: the chain to its `return`."""
        found = self.function(target)
        if found is None or found[1].returns_cpu is None:
            return None
        return (self.where(found[0]), found[1].returns_cpu)

    def collective_argument(self, target: Target, argument: int | str, bound: bool
                            ) -> tuple[str, tuple[Step, ...]] | None:
        """Calling `target` with a tensor in `argument`: whether a collective takes it (or, "*", takes its
        elements), at any depth through parameters passed on unchanged; the chain to the collective."""

        def collective_takes_it(_at: Target, summary: FunctionSummary, index: int, here: tuple[Step, ...]
                                ) -> tuple[str, tuple[Step, ...]] | None:
            for param, kind, step in summary.collective_params:
                if param == index:
                    return kind, (*here, step)
            return None

        return self._follow_parameter(target, argument, bound, collective_takes_it)

    def takes_tensors(self, target: Target) -> bool:
        """Some parameter of `target` reaches a collective (at any depth): worth a look at its callers."""
        if self._any_takers is None:
            self._any_takers = any(
                f.collective_params for m in self.modules.values() for f in m.functions.values()
            )
        if not self._any_takers:
            return False
        if self._tensor_takers is None:
            self._tensor_takers = {}
        if target not in self._tensor_takers:
            found = self.function(target)
            self._tensor_takers[target] = found is not None and any(
                self.collective_argument(found[0], i, False) for i in range(len(found[1].params)))
        return self._tensor_takers[target]

    def self_iterates(self, method: Target, path: str) -> tuple[Step, ...] | None:
        """A method that iterates `self.<path>` (itself or through other methods): the chain."""
        found = self.function(method)
        if found is None:
            return None
        for walked, chain in found[1].self_iterates:
            if walked == path:
                return chain
        return None

    def _made_once(self, key: str, make: Callable[[], frozenset[str]]) -> frozenset[str]:
        """`make()`, kept under `key` until a module is added (CallGraph.add forgets it)."""
        if key not in self.__dict__:
            self.__dict__[key] = make()
        return self.__dict__[key]

    def rank_test_methods(self) -> frozenset[str]:
        """The names of the project's methods and properties that return a rank test."""
        return self._made_once("_rank_test_methods", lambda: frozenset(
            name.rpartition(".")[2] for module in self.modules.values()
            for name, summary in module.functions.items()
            if "." in name and summary.returned is not None and (
                summary.returned.test or summary.returned.through is not None and (
                    shape := self.returned(Target(module.path, name))) is not None and shape.test)))

    def rank_functions(self) -> frozenset[str]:
        """The names of the project's functions that return a rank value or test, whatever they are called
        (`if leader():`, defined in another file): a function calling one may hold rank tests."""
        return self._made_once("_rank_functions", lambda: frozenset(
            name for module in self.modules.values() for name, summary in module.functions.items()
            if "." not in name and summary.returned is not None
            and self.returned(Target(module.path, name)) is not None))

    def tests_rank_attribute(self, path: str) -> bool:
        """The module's `if`s read an attribute holding a rank test or rank bound elsewhere in the project,
        and its code may reach a collective or a checkpoint write (else no rule that reads rank tests has
        anything to say there: in torch's own tree, `if x.dtype:`/`if self.device:` matched in 364 files)."""
        module = self.modules.get(path)
        words = self.attributes.words | self.rank_test_methods()
        if module is None or not module.tested_attributes & words:
            return False
        return any(f.collective is not None or f.save is not None or any(
            self.collective(site.target) or self.saves(site.target) for site in f.calls)
            for f in module.functions.values())

    def needs_project(self, path: str) -> bool:
        """Whether a file's findings can change with the other files known (second_pass.py)."""
        return needs_project(self, path)

    def any_returned(self) -> bool:
        """Some function of the project returns a rank value or test (made once)."""
        if self._any_returned is None:
            self._any_returned = any(f.returned for m in self.modules.values() for f in m.functions.values())
        return self._any_returned

    def any_tensor_takers(self) -> bool:
        """Some function of the project hands a parameter's tensor to a collective (made once)."""
        if self._any_takers is None:
            self._any_takers = any(
                f.collective_params for m in self.modules.values() for f in m.functions.values())
        return self._any_takers
