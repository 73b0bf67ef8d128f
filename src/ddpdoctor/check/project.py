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
"""

from __future__ import annotations

import ast
import bisect
import builtins
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from .collectives import TRIGGERS, CollectiveCalls
from .flows import Chain, ClassLoops, iterated, path_of, stored_parameters, suffix_after
from .guards import Function, RankFlow, rank_zero_decorator
from .program import launched
from .samplers import Shuffles, is_distributed_sampler, sampler_shuffles
from .source import call_name, dotted, keyword, statements
from .summaries import Returned, returned_ranks

if TYPE_CHECKING:
    from .source import SourceFile

PATHLIKE_WORDS = ("path", "file", "ckpt", "checkpoint", "dir", "out", "name")
MAX_ALIAS_HOPS = 8
MAX_SHOWN_STEPS = 6
COLLECTIVE_WORDS = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce", "gather",
                    "scatter", "all_to_all_single", "reduce_scatter_tensor")
# Frameworks whose loops call `set_epoch` on the sampler of a loader they are given: Lightning's fit loop
# (`_set_sampler_epoch`, lightning/fabric/utilities/data.py), accelerate's `DataLoaderShard.__iter__`
# (accelerate/data_loader.py), Hugging Face's Trainer, ignite's Engine. DeepSpeed and Horovod do not.
FRAMEWORK_PACKAGES = ("lightning", "accelerate", "ignite")
TRAINER_PACKAGES = ("transformers", "trl")

_Found = TypeVar("_Found")  # what a walk through parameters looks for


def runs_epochs_for_you(qualname: str) -> bool:
    return qualname.startswith(FRAMEWORK_PACKAGES) or (
        qualname.startswith(TRAINER_PACKAGES) and qualname.endswith("Trainer"))


@dataclass(frozen=True, order=True)
class Target:
    """A function of the project: the file it is defined in and its name there (`f` or `Class.method`)."""

    path: str
    name: str


@dataclass(frozen=True)
class Step:
    """One link of the evidence: what happens, where."""

    what: str
    path: str
    line: int

    def show(self) -> str:
        return f"{self.what} ({os.path.basename(self.path)}:{self.line})"


def show_chain(steps: tuple[Step, ...]) -> str:
    if len(steps) > MAX_SHOWN_STEPS:
        hidden = len(steps) - MAX_SHOWN_STEPS + 1
        steps = (
            *steps[: MAX_SHOWN_STEPS - 2],
            Step(f"… {hidden} more calls …", steps[-2].path, steps[-2].line),
            steps[-1],
        )
        return " → ".join(s.show() if not s.what.startswith("…") else s.what for s in steps)
    return " → ".join(s.show() for s in steps)


@dataclass(frozen=True)
class CallSite:
    """A call from one project function to another. `flows` pairs an argument (its position, or its keyword)
    with the caller's parameter passed there unchanged."""

    target: Target
    line: int
    guarded: bool  # under a rank test in the caller
    bound: bool  # `self.m(...)`: the callee's first parameter is the receiver
    flows: tuple[tuple[int | str, int], ...] = ()


@dataclass(frozen=True)
class FunctionSummary:
    name: str
    line: int
    params: tuple[str, ...]
    collective: Step | None  # the first collective it issues itself
    save: Step | None  # a `torch.save` to a shared path outside any rank test
    # (parameter index, what the loop takes from it (`['train']`, or "" for the parameter itself), line)
    iterates: tuple[tuple[int, str, int], ...]
    calls: tuple[CallSite, ...]
    rank_zero_only: bool  # decorated `@rank_zero_only` & co.: runs on one rank by construction
    returns_loader: Step | None = None  # returns a DataLoader over a shuffling DistributedSampler
    # where the loader is in what it returns: "" (the value itself), "[0]" (a tuple's first), "['train']"
    loader_suffixes: tuple[str, ...] = ()
    # a method: the `self` paths it iterates, itself or through `self.m()` calls, with the chain
    self_iterates: tuple[tuple[str, tuple[Step, ...]], ...] = ()
    # `__init__`: a constructor parameter (index, `self` counted) that an epoch loop of the class walks
    # (what it takes from it, and the chain from the loop)
    epoch_params: tuple[tuple[int, str, tuple[Step, ...]], ...] = ()
    keeps: tuple[tuple[str, int], ...] = ()  # `__init__`: `self.x = param` (attribute, parameter index)
    # parameters whose tensor a torch.distributed collective takes: (index, "" for the parameter itself or
    # "*" for its elements (`for v in stats.values(): all_reduce(v)`), the collective)
    collective_params: tuple[tuple[int, str, Step], ...] = ()
    returns_cpu: Step | None = None  # every `return` gives a CPU tensor (`return torch.tensor(x)`)
    returned: Returned | None = None  # what it returns in the rank domain (summaries.py)


@dataclass(frozen=True)
class ModuleSummary:
    path: str
    functions: dict[str, FunctionSummary]
    imports: frozenset[str]  # project files this module imports
    set_epoch: bool  # calls `.set_epoch(...)` somewhere
    trains: bool  # calls `.backward(` somewhere: training code
    framework: bool  # Lightning, accelerate, HF Trainer, DeepSpeed...: they call set_epoch themselves
    inits: tuple[BackendInit, ...]
    samplers: bool  # mentions DistributedSampler
    collectives: bool  # calls a torch.distributed collective that moves tensors
    manual_ddp: bool  # a hand-written DDP script (SourceFile.manual_ddp)
    stars: frozenset[str] = frozenset()  # project modules it imports with `from x import *`
    # attributes assigned a loader over a (maybe) shuffling DistributedSampler (`self.train_loader = ...`)
    loader_attributes: tuple[tuple[str, int], ...] = ()
    launched: bool = False  # shows a marker of a distributed program (program.launched)
    asks_program: bool = False  # a rule that asks whether the program is distributed wants this file


@dataclass(frozen=True)
class BackendInit:
    """An `init_process_group` whose default group has backends for CUDA only (or may have)."""

    path: str
    line: int
    how: str  # how the backend was determined, for the message
    hedged: bool  # only on some hosts or in some branches


class ProjectFiles:
    """The files of this run, for resolving imports to them: `import a.b` from `x/y/main.py` is
    `x/y/a/b.py`, `x/a/b.py`, ... (the script's directory, then its ancestors: packages and src layouts),
    or `a/b/__init__.py` at any of those places."""

    def __init__(self, paths: Iterable[str]):
        # Every dotted name a file could be imported as (`c`, `b.c`, `a.b.c` for a/b/c.py), with the
        # directory it is imported from: one dictionary look-up per import.
        self.by_name: dict[str, list[tuple[str, str]]] = {}
        for path in paths:
            full = os.path.abspath(path)
            parts = full.split(os.sep)
            last = parts[-1]
            if last in ("__init__.py", "__init__.pyi"):
                parts = parts[:-1]
            else:
                parts[-1] = last.removesuffix(".pyi").removesuffix(".py")
            for depth in range(1, min(len(parts), 12)):
                name = ".".join(parts[-depth:])
                root = os.sep.join(parts[:-depth]) or os.sep
                self.by_name.setdefault(name, []).append((root, path))
        self._cache: dict[tuple[str, str, int], str | None] = {}

    def module(self, dotted_name: str, from_path: str, level: int = 0) -> str | None:
        directory = os.path.dirname(from_path)
        key = (directory, dotted_name, level)
        if key in self._cache:
            return self._cache[key]
        found = self._find(dotted_name, from_path, level)
        self._cache[key] = found
        return found

    def _find(self, dotted_name: str, from_path: str, level: int) -> str | None:
        base = os.path.dirname(os.path.abspath(from_path))
        if level:
            for _ in range(level - 1):
                base = os.path.dirname(base)
            if not dotted_name:  # `from . import x`: the package itself
                init = os.path.join(base, "__init__.py")
                return next((p for r, p in self.by_name.get(os.path.basename(base), ()) if
                             os.path.abspath(p) == init), None)
        candidates = self.by_name.get(dotted_name)
        if not candidates:
            return None
        best: tuple[int, str] | None = None
        for root, path in candidates:
            if level and root != base:
                continue
            if base == root or base.startswith(root.rstrip(os.sep) + os.sep):
                if best is None or len(root) > best[0]:  # the nearest ancestor wins
                    best = (len(root), path)
        return best[1] if best else None


@dataclass(frozen=True)
class _Module:
    path: str


@dataclass(frozen=True)
class _Member:
    path: str
    name: str


_BUILTINS = frozenset(dir(builtins))


class Resolver:
    """Calls of one file to functions of the project: `f()`, `mod.f()`, `self.m()`, `Class.m()`, and a
    method of a local object made from a project class in the same function (`t = Trainer(); t.run()`)."""

    def __init__(self, source: SourceFile, files: ProjectFiles):
        self.path = source.path
        self._tree = source.tree
        self._attributes: dict[tuple[str, str], Target] | None = None
        self.names: dict[str, _Module | _Member] = {}
        self.stars: list[str] = []  # project modules imported with `from x import *`
        self.local: set[str] = set()
        self.classes: dict[str, list[ast.expr]] = {}
        for node in source.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.local.add(node.name)
            elif isinstance(node, ast.ClassDef):
                self.local.add(node.name)
                self.classes[node.name] = node.bases
        # The one walk over the file's statements: imports here, loops and assignments for the summary.
        self.loops: list[ast.For | ast.AsyncFor] = []
        self.whiles: list[ast.While] = []
        self.assigns: list[ast.Assign] = []
        self.returns: list[ast.Return] = []
        for node in statements(source.tree.body):
            cls = node.__class__
            if cls is ast.For or cls is ast.AsyncFor:
                self.loops.append(node)  # type: ignore[arg-type]
            elif cls is ast.While:
                self.whiles.append(node)  # type: ignore[arg-type]
            elif cls is ast.Assign:
                self.assigns.append(node)  # type: ignore[arg-type]
            elif cls is ast.Return:
                self.returns.append(node)  # type: ignore[arg-type]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        found = files.module(alias.name, self.path)
                        if found:
                            self.names[alias.asname] = _Module(found)
                    else:
                        top = alias.name.split(".")[0]
                        found = files.module(top, self.path)
                        if found:
                            self.names[top] = _Module(found)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                origin = files.module(base, self.path, node.level) if (base or node.level) else None
                for alias in node.names:
                    if alias.name == "*":
                        if origin is not None:
                            self.stars.append(origin)
                        continue
                    local = alias.asname or alias.name
                    sub = files.module(f"{base}.{alias.name}" if base else alias.name, self.path, node.level)
                    if sub is not None:
                        self.names[local] = _Module(sub)
                    elif origin is not None:
                        self.names[local] = _Member(origin, alias.name)
                    self.local.discard(local)

    def callee(self, func: ast.expr, cls: str | None, objects: dict[str, Target] | None = None
               ) -> tuple[Target, bool] | None:
        """The project function a call's callee names, and whether the call is bound (a method call)."""
        if isinstance(func, ast.Name):
            if func.id in self.local:
                return Target(self.path, func.id), False
            ref = self.names.get(func.id)
            if isinstance(ref, _Member):
                return Target(ref.path, ref.name), False
            if ref is None and self.stars and func.id not in _BUILTINS:
                # Maybe from a star import: the index looks through them (`ProjectIndex._reexport`).
                return Target(self.path, func.id), False
            return None
        if not isinstance(func, ast.Attribute):
            return None
        owner = func.value
        if isinstance(owner, ast.Name):
            if owner.id in ("self", "cls") and cls is not None:
                return Target(self.path, f"{cls}.{func.attr}"), True
            if owner.id in self.local and owner.id in self.classes:
                return Target(self.path, f"{owner.id}.{func.attr}"), False
            ref = self.names.get(owner.id)
            if isinstance(ref, _Module):
                return Target(ref.path, func.attr), False
            if isinstance(ref, _Member):  # `from pkg import Class` then `Class.method(...)`
                return Target(ref.path, f"{ref.name}.{func.attr}"), False
            if objects and owner.id in objects:
                made = objects[owner.id]
                return Target(made.path, f"{made.name}.{func.attr}"), True
        elif isinstance(owner, ast.Attribute) and cls is not None and isinstance(owner.value, ast.Name) and (
                owner.value.id == "self"):
            kept = self.attribute_class(cls, owner.attr)
            if kept is not None:  # `self.ckpt = Checkpointer(...)` in the class, then `self.ckpt.save()`
                return Target(kept.path, f"{kept.name}.{func.attr}"), True
        return None

    def attribute_class(self, cls: str, attribute: str) -> Target | None:
        """The project class an attribute of `self` is made from in the class's methods (`self.x = C()`),
        when every such assignment makes the same one."""
        if self._attributes is None:
            made: dict[tuple[str, str], Target | None] = {}
            spans = [(node.lineno, node.end_lineno or node.lineno, node.name) for node in self._tree.body
                     if isinstance(node, ast.ClassDef)]
            for stmt in self.assigns:  # collected by the one walk over the file
                if not isinstance(stmt.value, ast.Call):
                    continue
                for target in stmt.targets:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and (
                            target.value.id == "self"):
                        owner = next(
                            (name for first, last, name in spans if first <= stmt.lineno <= last), None
                        )
                        if owner is not None:
                            key = (owner, target.attr)
                            made_here = self.class_of(stmt.value)
                            if made_here is None or not made_here.name[:1].isupper():
                                made[key] = None
                            else:
                                made[key] = made_here if made.get(key, made_here) == made_here else None
            self._attributes = {key: target for key, target in made.items() if target is not None}
        return self._attributes.get((cls, attribute))

    def class_of(self, call: ast.expr) -> Target | None:
        """`Trainer(...)`: the project class a constructor call names."""
        if isinstance(call, ast.Call):
            found = self.callee(call.func, None)
            if found is not None:
                return found[0]
        return None


def _param_names(func: Function) -> tuple[str, ...]:
    args = func.args
    return tuple(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))


def looks_like_path(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.JoinedStr, ast.BinOp)):
        return True
    if isinstance(node, ast.Call):
        return (dotted(node.func) or "").rsplit(".", 1)[-1] in ("join", "Path", "format", "str")
    name = (dotted(node) or "").rsplit(".", 1)[-1].lower()
    return any(word in name for word in PATHLIKE_WORDS)


def is_buffer(source: SourceFile, node: ast.expr) -> bool:
    """`torch.save(obj, io.BytesIO())` or into a name bound to one: memory, not a shared file."""
    return "BytesIO" in source.segment(node) or isinstance(node, ast.Name) and "buf" in node.id.lower()


def guarded_calls(source: SourceFile) -> set[int]:
    """ids of the calls of a file that run under a rank test (or after an early exit of the others)."""
    flow = RankFlow(source, lambda branch, cls: False)
    return {id(g.call) for g in flow.calls if g.guard is not None and not g.guard.trusted}


MODULE = "<module>"  # the calls of a file's top-level code: no function, never a call target


@dataclass
class _Scope:
    name: str
    line: int
    end: int
    cls: str | None
    params: tuple[str, ...]
    rank_zero_only: bool
    collective: Step | None = None
    save: Step | None = None
    returns_loader: Step | None = None
    loader_suffixes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.position = {name: i for i, name in enumerate(self.params)}
        self.calls: list[CallSite] = []
        self.iterates: list[tuple[int, str, int]] = []
        self.objects: dict[str, Target] = {}
        self.self_iterates: tuple[tuple[str, tuple[Step, ...]], ...] = ()
        self.epoch_params: tuple[tuple[int, str, tuple[Step, ...]], ...] = ()
        self.keeps: tuple[tuple[str, int], ...] = ()
        self.collective_params: list[tuple[int, str, Step]] = []
        self.returns_cpu: Step | None = None


def summarize(source: SourceFile, files: ProjectFiles) -> ModuleSummary:
    """One pass over the file's calls (shared with the rules) and statements, each attributed to the
    top-level function or method whose lines hold it (a nested function counts as part of its parent)."""
    from .backends import FRAMEWORK_WORDS, nccl_inits  # the backend reasoning is DDP301's, shared here
    from .registry import all_rules

    text = source.text
    resolver = source.project.resolver(source) if source.project is not None else Resolver(source, files)
    labels = CollectiveCalls(source) if any(t in text for t in TRIGGERS) else None
    guarded = (
        guarded_calls(source) if ("rank" in text or "_zero" in text or "main_process" in text) else set()
    )
    scopes: list[_Scope] = []
    definitions: list[tuple[str, ast.AST]] = []
    for node in source.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scopes.append(_scope(node, node.name, None))
            definitions.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    scopes.append(_scope(item, f"{node.name}.{item.name}", node.name))
                    definitions.append((f"{node.name}.{item.name}", item))
    returned = returned_ranks(source, resolver, definitions) if any(
        word in text for word in ("rank", "RANK", "PROCID", "LOCALID")) else {}
    scopes.sort(key=lambda sc: sc.line)
    starts = [sc.line for sc in scopes]
    module = _Scope(MODULE, 0, 0, None, (), False)

    def owner(line: int) -> _Scope:
        i = bisect.bisect_right(starts, line) - 1
        return scopes[i] if i >= 0 and line <= scopes[i].end else module

    saves = "save" in text
    for stmt in resolver.assigns:
        if (
            len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and isinstance(stmt.value, ast.Call)
        ):
            made = resolver.class_of(stmt.value)
            if made is not None and made.name[:1].isupper():
                owner(stmt.lineno).objects[stmt.targets[0].id] = made
    for call in source.calls:
        scope = owner(call.lineno)
        if (
            labels is not None
            and scope.collective is None
            and not scope.rank_zero_only
            and scope is not module
        ):
            label = labels.label(call)
            if label is not None:
                scope.collective = Step(f"`{label}`", source.path, call.lineno)
                continue
        func = call.func
        if saves and scope.save is None and len(call.args) >= 2 and isinstance(func, ast.Attribute) and (
                func.attr == "save") and id(call) not in guarded and source.resolve(func) == "torch.save":
            where = call.args[1]
            if looks_like_path(where) and "rank" not in source.segment(where).lower() and not is_buffer(
                    source, where):
                scope.save = Step(
                    f"`torch.save(…, {_short(source.segment(where))})`", source.path, call.lineno
                )
            continue
        found = resolver.callee(func, scope.cls, scope.objects)
        if found is None:
            continue
        target, bound = found
        flows: list[tuple[int | str, int]] = []
        position = scope.position
        if position:
            for i, arg in enumerate(call.args):
                if isinstance(arg, ast.Name) and arg.id in position:
                    flows.append((i, position[arg.id]))
            for kw in call.keywords:
                if kw.arg and isinstance(kw.value, ast.Name) and kw.value.id in position:
                    flows.append((kw.arg, position[kw.value.id]))
        scope.calls.append(CallSite(target, call.lineno, id(call) in guarded, bound, tuple(flows)))
    for loop in resolver.loops:
        scope = owner(loop.lineno)
        walked = iterated(loop.iter)
        path = path_of(walked) if walked is not None and scope.position else None
        if path:
            root = path.split(".", 1)[0].split("[", 1)[0]
            if root in scope.position:
                scope.iterates.append((scope.position[root], path[len(root):], loop.lineno))
    loader_attributes: list[tuple[str, int]] = []
    if "DistributedSampler" in text:
        loader_attributes = _loader_builders(source, resolver, owner)
    if "distributed" in text and any(word in text for word in COLLECTIVE_WORDS):
        _collective_params(source, resolver, owner)
    if "torch" in text and resolver.returns:
        _cpu_returns(source, resolver, owner)
    if "in self." in text:
        _class_loops(source, resolver, owner, scopes)
    functions = {
        sc.name: FunctionSummary(
            sc.name,
            sc.line,
            sc.params,
            sc.collective,
            sc.save,
            tuple(sc.iterates),
            tuple(sc.calls),
            sc.rank_zero_only,
            sc.returns_loader,
            sc.loader_suffixes,
            sc.self_iterates,
            sc.epoch_params,
            sc.keeps,
            tuple(sc.collective_params),
            sc.returns_cpu,
            returned.get(sc.name),
        )
        for sc in (*scopes, module)
    }
    for cls, bases in resolver.classes.items():  # inherited methods: project base classes
        for base in bases:
            base_ref = resolver.callee(base, None) if isinstance(base, (ast.Name, ast.Attribute)) else None
            if base_ref is not None:
                functions.setdefault(
                    f"{cls}.__bases__",
                    FunctionSummary(
                        f"{cls}.__bases__",
                        0,
                        (),
                        None,
                        None,
                        (),
                        (CallSite(base_ref[0], 0, False, False),),
                        False,
                    ),
                )
    return ModuleSummary(
        path=source.path,
        functions=functions,
        imports=frozenset(ref.path for ref in resolver.names.values()) | frozenset(resolver.stars),
        stars=frozenset(resolver.stars),
        loader_attributes=tuple(loader_attributes),
        set_epoch="set_epoch" in text
        and any(isinstance(c.func, ast.Attribute) and c.func.attr == "set_epoch" for c in source.calls),
        trains="backward(" in text,
        framework=any(runs_epochs_for_you(q) for q in source.imports.names.values()),
        inits=tuple(nccl_inits(source))
        if "init_process_group" in text or any(word in text for word in FRAMEWORK_WORDS)
        else (),
        samplers="DistributedSampler" in text,
        collectives="distributed" in text
        and any(word in text for word in COLLECTIVE_WORDS)
        and any(_moves_tensors(source, c) for c in source.calls),
        manual_ddp=("init_process_group" in text or "DistributedDataParallel" in text or ".module" in text)
        and source.manual_ddp,
        launched=launched(source),
        asks_program=any(rule.asks_program and rule.wanted(text) for rule in all_rules().values()),
    )


def _moves_tensors(source: SourceFile, call: ast.Call) -> bool:
    qual = source.resolve(call.func) or ""
    head, _, op = qual.rpartition(".")
    return head.startswith("torch.distributed") and op in COLLECTIVE_WORDS


def shuffling_sampler(call: ast.expr, source: SourceFile | None = None) -> bool:
    """`DistributedSampler(...)` that shuffles, or may (`samplers.py`: `shuffle` left to its default, True,
    or a value that is or may be true). With `shuffle=False` on every path there is no order to renew. A
    conditional counts when one branch is one (`DistributedSampler(ds) if distributed else None`)."""
    if isinstance(call, ast.IfExp):
        return shuffling_sampler(call.body, source) or shuffling_sampler(call.orelse, source)
    if not isinstance(call, ast.Call) or not is_distributed_sampler(call, source):
        return False
    return sampler_shuffles(call, source).shuffles is not Shuffles.NO


def distributed_loader(value: ast.expr, samplers: set[str], source: SourceFile | None = None) -> bool:
    """`DataLoader(..., sampler=DistributedSampler(...))`, or with a sampler path bound to one."""
    if not (isinstance(value, ast.Call) and call_name(value).endswith("DataLoader")):
        return False
    sampler = keyword(value, "sampler")
    return sampler is not None and (shuffling_sampler(sampler.value, source) or path_of(sampler.value) in
                                    samplers)


def held_loaders(value: ast.expr, samplers: set[str], loaders: set[str], depth: int = 0,
                 source: SourceFile | None = None) -> list[str]:
    """Where an expression holds a loader over a shuffling DistributedSampler: "" for the value itself,
    `[0]` in a tuple, `['train']` in a dict (`{"train": DataLoader(...)}`, `dict(train=...)`), or the
    suffixes of a path known to hold loaders (`loaders` when `loaders['train']` is one)."""
    if depth > 3:
        return []
    if distributed_loader(value, samplers, source):
        return [""]
    if isinstance(value, (ast.Tuple, ast.List)):
        return [f"[{i}]{rest}" for i, item in enumerate(value.elts)
                for rest in held_loaders(item, samplers, loaders, depth + 1, source)]
    if isinstance(value, ast.Dict):
        return [f"[{key.value!r}]{rest}" for key, item in zip(value.keys, value.values, strict=True)
                if isinstance(key, ast.Constant) and isinstance(key.value, (str, int))
                for rest in held_loaders(item, samplers, loaders, depth + 1, source)]
    if isinstance(value, ast.Call) and call_name(value) == "dict" and not value.args:
        return [f"[{kw.arg!r}]{rest}" for kw in value.keywords if kw.arg
                for rest in held_loaders(kw.value, samplers, loaders, depth + 1, source)]
    path = path_of(value)
    if path is None or not loaders:
        return []
    return [rest for held in loaders if (rest := suffix_after(held, path)) is not None]


def bound_paths(target: ast.expr, suffixes: Iterable[str]) -> list[str]:
    """The paths an assignment to `target` binds, given where the value holds what is followed:
    `a, b = (x, y)` with `[1]` binds `b`; `loaders = {...}` with `['train']` binds `loaders['train']`."""
    found: list[str] = []
    for suffix in suffixes:
        if isinstance(target, (ast.Tuple, ast.List)):
            if not suffix.startswith("["):
                continue
            index, _, rest = suffix[1:].partition("]")
            if index.isdigit() and int(index) < len(target.elts):
                found += bound_paths(target.elts[int(index)], [rest])
            continue
        path = path_of(target)
        if path is not None:
            found.append(path + suffix)
    return found


def _loader_builders(source: SourceFile, resolver: Resolver, owner: Callable[[int], _Scope]
                     ) -> list[tuple[str, int]]:
    """Functions that return a loader over a shuffling DistributedSampler (`def build_loader(...)`), alone
    or in a tuple or a dict (`return train_loader, sampler`); and the attributes such a loader is kept on
    (`self.train_loader = DataLoader(...)`), with their lines, for the files that read them."""
    attributes: list[tuple[str, int]] = []
    samplers: dict[int, set[str]] = {}
    loaders: dict[int, set[str]] = {}
    for stmt in resolver.assigns:
        if shuffling_sampler(stmt.value, source):
            samplers.setdefault(id(owner(stmt.lineno)), set()).update(
                p for t in stmt.targets if (p := path_of(t)))
    for stmt in resolver.assigns:
        scope = id(owner(stmt.lineno))
        held = held_loaders(stmt.value, samplers.get(scope, set()), loaders.get(scope, set()), source=source)
        if held:
            for target in stmt.targets:
                loaders.setdefault(scope, set()).update(bound_paths(target, held))
                if "" in held and isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                    attributes.append((target.attr, stmt.lineno))
    for ret in resolver.returns:
        scope_obj = owner(ret.lineno)
        value = ret.value
        if value is None or scope_obj.name == MODULE:
            continue
        held = held_loaders(value, samplers.get(id(scope_obj), set()), loaders.get(id(scope_obj), set()),
                            source=source)
        if held and scope_obj.returns_loader is None:
            scope_obj.returns_loader = Step(
                f"`return {_short(source.segment(value))}`", source.path, ret.lineno
            )
            scope_obj.loader_suffixes = tuple(dict.fromkeys(held))
    return attributes


# Position of the tensor argument(s) of each torch.distributed collective that moves tensor data.
TENSOR_ARGS = {
    "all_reduce": (0,),
    "broadcast": (0,),
    "reduce": (0,),
    "all_gather": (1,),
    "all_gather_into_tensor": (0, 1),
    "reduce_scatter_tensor": (0, 1),
    "all_to_all_single": (0, 1),
    "gather": (0,),
    "scatter": (0,),
}


def _collective_params(source: SourceFile, resolver: Resolver, owner: Callable[[int], _Scope]) -> None:
    """Parameters that reach a collective's tensor argument: `def reduce(t): dist.all_reduce(t)`,
    `param.data`, or the elements of a container parameter (`for v in stats.values(): all_reduce(v)`)."""
    elements: dict[int, dict[str, int]] = {}  # per scope: loop variable → the parameter it walks
    rebound: dict[int, set[str]] = {}  # `t = t.cuda()`: no longer what the caller passed
    for stmt in resolver.assigns:
        rebound.setdefault(id(owner(stmt.lineno)), set()).update(
            n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name))
    for loop in resolver.loops:
        scope = owner(loop.lineno)
        walked = loop.iter
        if isinstance(walked, ast.Call) and isinstance(walked.func, ast.Attribute) and walked.func.attr in (
                "values", "items") and not walked.args:
            walked = walked.func.value
        if not (isinstance(walked, ast.Name) and walked.id in scope.position):
            continue
        target = loop.target
        if isinstance(target, ast.Tuple) and len(target.elts) == 2:
            target = target.elts[1]  # `for k, v in stats.items()`
        if isinstance(target, ast.Name):
            elements.setdefault(id(scope), {})[target.id] = scope.position[walked.id]
    for call in source.calls:
        func = call.func
        if (func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                ) not in TENSOR_ARGS:
            continue
        scope = owner(call.lineno)
        if not scope.position:
            continue
        qual = source.resolve(func) or ""
        head, _, op = qual.rpartition(".")
        if not head.startswith("torch.distributed") or op not in TENSOR_ARGS:
            continue
        for index in TENSOR_ARGS[op]:
            arg = call.args[index] if index < len(call.args) else None
            if isinstance(arg, ast.Attribute) and arg.attr == "data":
                arg = arg.value
            if not isinstance(arg, ast.Name) or arg.id in rebound.get(id(scope), ()):
                continue
            step = Step(f"`{op}({arg.id})`", source.path, call.lineno)
            if arg.id in scope.position:
                scope.collective_params.append((scope.position[arg.id], "", step))
            elif arg.id in elements.get(id(scope), {}):
                scope.collective_params.append((elements[id(scope)][arg.id], "*", step))


def _cpu_returns(source: SourceFile, resolver: Resolver, owner: Callable[[int], _Scope]) -> None:
    """Functions whose every `return` gives a CPU tensor: `return torch.tensor(x)`, or a name bound only
    to such an expression."""
    from .tensors import cpu_expression

    returns: dict[int, list[tuple[ast.Return, _Scope]]] = {}
    for ret in resolver.returns:
        scope = owner(ret.lineno)
        if scope.name != MODULE:
            returns.setdefault(id(scope), []).append((ret, scope))
    # Only functions whose first return can be a tensor are looked at further.
    returns = {key: found for key, found in returns.items()
               if isinstance(found[0][0].value, (ast.Call, ast.Name))}
    returned = {(id(scope), ret.value.id) for found in returns.values() for ret, scope in found
                if isinstance(ret.value, ast.Name)}
    bound: dict[tuple[int, str], list[str | None]] = {}
    names = {name for _, name in returned}
    if returned:
        for stmt in resolver.assigns:
            if not any(isinstance(target, ast.Name) and target.id in names for target in stmt.targets):
                continue
            scope_id = id(owner(stmt.lineno))
            for target in stmt.targets:
                if isinstance(target, ast.Name) and (scope_id, target.id) in returned:
                    bound.setdefault((scope_id, target.id), []).append(cpu_expression(source, stmt.value))
    for found in returns.values():
        made: list[tuple[ast.Return, str]] = []
        for ret, scope in found:
            value = ret.value
            how = cpu_expression(source, value) if value is not None else None
            if how is None and isinstance(value, ast.Name):
                values = bound.get((id(scope), value.id), [])
                how = values[0] if values and all(values) else None
            if how is None:
                break
            made.append((ret, how))
        else:
            ret, how = made[0]
            how = how.split(", line")[0]
            found[0][1].returns_cpu = Step(
                f"`return {_short(source.segment(ret.value))}` ({how})" if ret.value else "",
                source.path,
                ret.lineno,
            )


def _class_loops(source: SourceFile, resolver: Resolver, owner: Callable[[int], _Scope],
                 scopes: list[_Scope]) -> None:
    """What each class's methods iterate on `self`, and which constructor parameters its epoch loops walk.
    Only classes with a `for … in self.…` loop are looked at."""
    loops: dict[str, list[tuple[str, ast.For | ast.AsyncFor | ast.While]]] = {}
    for loop in (*resolver.loops, *resolver.whiles):
        scope = owner(loop.lineno)
        if scope.cls is not None:
            loops.setdefault(scope.cls, []).append((scope.name.partition(".")[2], loop))
    wanted = {cls for cls, found in loops.items() if any(
        (path_of(walked) or "").startswith("self.") for _, loop in found
        if isinstance(loop, (ast.For, ast.AsyncFor)) and (walked := iterated(loop.iter)) is not None)}
    if not wanted:
        return
    by_name = {sc.name: sc for sc in scopes}
    calls: dict[str, list[tuple[str, ast.Call]]] = {}
    for call in source.calls:
        func = call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            scope = owner(call.lineno)
            if scope.cls in wanted:
                calls.setdefault(scope.cls, []).append((scope.name.partition(".")[2], call))  # type: ignore[arg-type]
    definitions = {node.name: node for node in source.tree.body if isinstance(node, ast.ClassDef)}
    for cls in wanted:
        methods = {sc.name.partition(".")[2] for sc in scopes if sc.cls == cls}
        class_loops = ClassLoops(methods, loops[cls], calls.get(cls, []))

        def steps(chain: Chain) -> tuple[Step, ...]:
            return tuple(Step(link.what, source.path, link.line) for link in chain)

        for method, paths in class_loops.iterates().items():
            walker = by_name.get(f"{cls}.{method}")
            if walker is not None and paths:
                walker.self_iterates = tuple((path, steps(chain)) for path, chain in paths.items())
        init = by_name.get(f"{cls}.__init__")
        definition = definitions.get(cls)
        init_node = (
            next(
                (
                    item
                    for item in definition.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__init__"
                ),
                None,
            )
            if definition is not None
            else None
        )
        stored = stored_parameters(init_node) if init_node is not None else {}
        if not stored or init is None:
            continue
        init.keeps = tuple(stored.items())
        walked_params: list[tuple[int, str, tuple[Step, ...]]] = []
        for path, chain in class_loops.epoch_loops():
            for attr, index in stored.items():
                rest = suffix_after(path, attr)
                if rest is not None:
                    walked_params.append((index, rest, steps(chain)))
        init.epoch_params = tuple(walked_params)


def _scope(func: Function, name: str, cls: str | None) -> _Scope:
    return _Scope(name, func.lineno, func.end_lineno or func.lineno, cls, _param_names(func),
                  rank_zero_decorator(func) is not None)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 40 else text[:37] + "..."


class ProjectIndex:
    """The summaries of every module of the run, and the facts that follow from them."""

    def __init__(self, summaries: Iterable[ModuleSummary], files: ProjectFiles):
        self.files = files
        self._resolver: tuple[ast.Module, Resolver] | None = None
        self._called: dict[Target, set[str]] | None = None
        self._builders: bool | None = None
        self.modules: dict[str, ModuleSummary] = {s.path: s for s in summaries}
        self._memo: dict[str, dict[Target, tuple[Step, ...] | None]] = {}
        self._components: dict[str, int] | None = None
        self._tensor_takers: dict[Target, bool] | None = None
        self._any_takers: bool | None = None
        self._returned: dict[Target, Returned | None] = {}
        self._any_returned: bool | None = None

    def resolver(self, source: SourceFile) -> Resolver:
        """The call resolver of the file being checked (made once per file, shared by the summary and
        the rules)."""
        if self._resolver is None or self._resolver[0] is not source.tree:
            self._resolver = (source.tree, Resolver(source, self.files))
        return self._resolver[1]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_resolver"] = None  # an AST is not for other processes
        return state

    # -- functions ---------------------------------------------------------------------------------
    def function(self, target: Target) -> tuple[Target, FunctionSummary] | None:
        """The summary of a function, following re-exports (`from .core import train` in `__init__.py`)
        and methods inherited from project base classes."""
        seen = 0
        while seen < MAX_ALIAS_HOPS:
            seen += 1
            module = self.modules.get(target.path)
            if module is None:
                return None
            found = module.functions.get(target.name)
            if found is not None:
                return target, found
            cls, _, method = target.name.partition(".")
            if method:
                bases = module.functions.get(f"{cls}.__bases__")
                if bases is None or not bases.calls:
                    return None
                base = bases.calls[0].target
                target = Target(base.path, f"{base.name}.{method}")
                continue
            following = self._reexport(target)
            if following is None:
                return None
            target = following
        return None

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
    def collective(self, target: Target) -> tuple[Step, ...] | None:
        """The chain from `target` to a collective it may issue, at any depth, or None."""
        return self._search("collective", target, lambda f: None if f.rank_zero_only else f.collective,
                            lambda site: True, stop=lambda f: f.rank_zero_only)

    def saves(self, target: Target) -> tuple[Step, ...] | None:
        """The chain from `target` to a `torch.save` to a shared path that runs on every rank calling it."""
        return self._search("save", target, lambda f: f.save, lambda site: not site.guarded,
                            stop=lambda f: f.rank_zero_only)

    def _search(self, fact: str, start: Target, direct: Callable[[FunctionSummary], Step | None],
                follow: Callable[[CallSite], bool], stop: Callable[[FunctionSummary], bool]
                ) -> tuple[Step, ...] | None:
        memo = self._memo.setdefault(fact, {})
        if start in memo:
            return memo[start]
        # Iterative depth-first search. A function being explored is in the memo as None, so a cycle
        # ends there: it can only hide a chain, never invent one.
        frames: list[tuple[Target, list[CallSite], int]] = []

        def enter(target: Target) -> None:
            found = self.function(target)
            memo[target] = None
            if found is None or stop(found[1]):
                return
            step = direct(found[1])
            if step is not None:
                memo[target] = (step,)
                return
            frames.append((target, [s for s in found[1].calls if follow(s)], 0))

        enter(start)
        while frames:
            target, sites, i = frames[-1]
            if i >= len(sites):
                frames.pop()
                continue
            child = sites[i].target
            if child not in memo:
                enter(child)
                continue
            inner = memo[child]
            if inner is not None:
                path, line = self._where(child)
                memo[target] = (Step(f"`{child.name}()`", path, line), *inner)
                frames.pop()
                continue
            frames[-1] = (target, sites, i + 1)
        return memo.get(start)

    def _has_builders(self) -> bool:
        if self._builders is None:
            self._builders = any(
                f.returns_loader for m in self.modules.values() for f in m.functions.values()
            )
        return self._builders

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

    def returns_loader(self, target: Target) -> tuple[tuple[Step, ...], tuple[str, ...]] | None:
        """`build_loader()` (any module): the chain to its `return DataLoader(..., sampler=...)`, and where
        the loader is in what it returns ("" itself, `[0]` in a tuple, `['train']` in a dict)."""
        found = self.function(target)
        if found is None or found[1].returns_loader is None:
            return None
        return (self.where(found[0]), found[1].returns_loader), found[1].loader_suffixes or ("",)

    def iterates(self, target: Target, argument: int | str, bound: bool, suffix: str = ""
                 ) -> tuple[Step, ...] | None:
        """The chain from calling `target` with a loader in `argument` (at `suffix` in it: `['train']` when
        a dict of loaders is passed) to a `for` loop over it."""

        def loop_over_it(at: Target, summary: FunctionSummary, index: int, here: tuple[Step, ...]
                         ) -> tuple[Step, ...] | None:
            for param, taken, line in summary.iterates:
                if param == index and taken == suffix:
                    return (*here, Step(f"`for … in {summary.params[param]}{taken}`", at.path, line))
            return None

        return self._follow_parameter(target, argument, bound, loop_over_it)

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
            here = (*path, Step(f"`{self._display(target)}()`", target.path, summary.line))
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

    def epoch_loop(self, cls: Target, argument: int | str, suffix: str = "") -> tuple[Step, ...] | None:
        """Constructing the project class `cls` with a loader in `argument` (at `suffix` in it): the chain
        to an epoch loop of the class over it (`Trainer.run()`'s `while True` → `self.train_epoch()` →
        `for … in self.loaders['train']`)."""
        found = self.function(Target(cls.path, f"{cls.name}.__init__"))
        if found is None or not found[1].epoch_params:
            return None
        index = self._parameter(found[1], argument, True)
        for param, taken, chain in found[1].epoch_params:
            if param == index and taken == suffix:
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

    @staticmethod
    def _parameter(summary: FunctionSummary, argument: int | str, bound: bool) -> int | None:
        if isinstance(argument, str):
            return summary.params.index(argument) if argument in summary.params else None
        index = argument + (1 if bound else 0)
        return index if index < len(summary.params) else None

    def where(self, target: Target) -> Step:
        """The definition of a function, as the first step of a chain: `train()` (main.py:26)."""
        path, line = self._where(target)
        return Step(f"`{target.name.rsplit('.', 1)[-1]}()`", path, line)

    def _where(self, target: Target) -> tuple[str, int]:
        found = self.function(target)
        return (found[0].path, found[1].line) if found else (target.path, 0)

    @staticmethod
    def _display(target: Target) -> str:
        return target.name

    def needs_project(self, path: str) -> bool:
        """Whether a file's findings can change with the other files known: it calls into another module
        whose function issues a collective, writes a checkpoint or iterates an argument; it builds a
        DistributedSampler without calling `set_epoch`; or it makes collectives and is initialised
        elsewhere. Only these files are checked again with the whole index."""
        module = self.modules.get(path)
        if module is None:
            return False
        if module.samplers and not module.set_epoch:
            return True
        if module.trains and not module.set_epoch and any(m.loader_attributes for m in self.component(path)):
            return True  # DDP501: a loader kept on an attribute in another file, iterated here
        if module.asks_program and not module.launched and any(m.launched for m in self.component(path)):
            return True  # a helper module of a distributed program
        if self._any_returned is None:
            self._any_returned = any(f.returned for m in self.modules.values() for f in m.functions.values())
        if self._any_returned and any(site.target.path != path or module.stars
                                      for f in module.functions.values() for site in f.calls
                                      if self.returned(site.target)):
            return True  # a rank read through a helper of another file (`rank, ws = get_dist_info()`)
        if self._has_builders() and any(self.returns_loader(site.target) for f in module.functions.values()
                                        for site in f.calls):
            return True  # `loader = build_loader(...)`: DDP501 follows it
        if module.collectives and not module.inits and any(m.inits for m in self.component(path)):
            return True
        if module.collectives and any(self._leaves(path, site.target, ()) and self.returns_cpu(site.target)
                                      for f in module.functions.values() for site in f.calls):
            return True  # DDP301: a tensor made on the CPU in another file
        if module.collectives and any(self._leaves(path, site.target, ()) and self.returns_cpu(site.target)
                                      for f in module.functions.values() for site in f.calls):
            return True  # DDP301: a tensor made on the CPU in another file
        if self._any_takers is None:
            self._any_takers = any(
                f.collective_params for m in self.modules.values() for f in m.functions.values()
            )
        if self._any_takers and any(self._leaves(path, site.target, ()) and self.takes_tensors(site.target)
                                    for f in module.functions.values() for site in f.calls) and any(
                m.inits for m in self.component(path)):
            return True  # DDP301: a CPU tensor may be passed to a collective in another file
        for function in module.functions.values():
            for site in function.calls:
                if site.guarded and self._leaves(path, site.target, self.collective(site.target)):
                    return True  # DDP101
                if module.manual_ddp and not site.guarded and self._leaves(path, site.target,
                                                                           self.saves(site.target)):
                    return True  # DDP601
        return False

    def _leaves(self, path: str, target: Target, chain: tuple[Step, ...] | None) -> bool:
        """A chain that the first pass, knowing only this file, could not have followed."""
        if chain is None:
            return False
        return target.path != path or "." in target.name or any(step.path != path for step in chain)

    # -- whole-project facts -----------------------------------------------------------------------
    def component(self, path: str) -> list[ModuleSummary]:
        """The modules connected to `path` by project imports (either way): one program, as far as the
        checker can tell. A tree of independent scripts is many programs."""
        if self._components is None:
            self._components = self._connect()
        key = self._components.get(path)
        if key is None:
            return [self.modules[path]] if path in self.modules else []
        return [m for p, m in self.modules.items() if self._components.get(p) == key]

    def _connect(self) -> dict[str, int]:
        parent: dict[str, str] = {p: p for p in self.modules}

        def find(p: str) -> str:
            while parent[p] != p:
                parent[p] = parent[parent[p]]
                p = parent[p]
            return p

        for path, module in self.modules.items():
            for other in module.imports:
                if other in parent:
                    a, b = find(path), find(other)
                    if a != b:
                        parent[a] = b
        roots: dict[str, int] = {}
        return {p: roots.setdefault(find(p), len(roots)) for p in self.modules}
