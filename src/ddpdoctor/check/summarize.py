"""The first pass: one file read once into its `ModuleSummary` (its project imports, and per function the
collective it issues, the checkpoint it writes, the parameters it iterates, the project calls it makes and
which of its parameters flow into them, what it returns in the rank domain). No AST outlives it."""

from __future__ import annotations

import ast
import bisect
import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from .attributes import RankArgument, attribute_bindings, rank_arguments, tested_attributes
from .collectives import TENSOR_ARGS, TRIGGERS, CollectiveCalls
from .facts import CallSite, FunctionSummary, ModuleSummary, Step, Target
from .flows import iterated, path_of
from .guards import RankFlow
from .index import ProjectFiles, Resolver
from .loaders import _class_loops, _loader_builders
from .program import launched, makes_group
from .ranks import RankNames
from .scope import MODULE, _Scope, _scope, _short
from .sharding import file_shards
from .summaries import _returns as _own_returns
from .summaries import returned_ranks
from .writes import save_destination, shared_destination

if TYPE_CHECKING:
    from .registry import Rule
    from .source import SourceFile

RANK_TEXT = ("rank", "RANK", "PROCID", "LOCALID", "_zero", "main_process", "master")
MAX_ALIAS_HOPS = 8
MAX_SHOWN_STEPS = 6
COLLECTIVE_WORDS = tuple(TENSOR_ARGS)  # the collectives that move tensor data (the shared table)
# Frameworks whose loops call `set_epoch` on the sampler of a loader they are given: Lightning's fit loop
# (`_set_sampler_epoch`, lightning/fabric/utilities/data.py), accelerate's `DataLoaderShard.__iter__`
# (accelerate/data_loader.py), Hugging Face's Trainer, ignite's Engine. DeepSpeed and Horovod do not.
FRAMEWORK_PACKAGES = ("lightning", "accelerate", "ignite")
TRAINER_PACKAGES = ("transformers", "trl")


@functools.cache
def _program_rules() -> tuple[type[Rule], ...]:
    """The rules that ask whether the program is distributed (`Rule.asks_program`)."""
    from .registry import all_rules

    return tuple(rule for rule in all_rules().values() if rule.asks_program)


def runs_epochs_for_you(qualname: str) -> bool:
    return qualname.startswith(FRAMEWORK_PACKAGES) or (
        qualname.startswith(TRAINER_PACKAGES) and qualname.endswith("Trainer"))



def guarded_calls(source: SourceFile) -> set[int]:
    """ids of the calls of a file that run under a rank test (or after an early exit of the others)."""
    flow = RankFlow(source, lambda branch, cls: False)
    return {id(g.call) for g in flow.calls if g.guard is not None and not g.guard.trusted}



def summarize(source: SourceFile, files: ProjectFiles) -> ModuleSummary:
    """One pass over the file's calls (shared with the rules) and statements, each attributed to the
    top-level function or method whose lines hold it (a nested function counts as part of its parent)."""
    from .backends import FRAMEWORK_WORDS, nccl_inits  # the backend reasoning is DDP301's, shared here

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
    factories = _factories(resolver, definitions) if "classmethod" in text or "staticmethod" in text else {}
    scopes.sort(key=lambda sc: sc.line)
    starts = [sc.line for sc in scopes]
    module = _Scope(MODULE, 0, 0, None, (), False)

    def owner(line: int) -> _Scope:
        i = bisect.bisect_right(starts, line) - 1
        return scopes[i] if i >= 0 and line <= scopes[i].end else module

    ranked = any(word in text for word in RANK_TEXT)
    rank_args: list[RankArgument] = []
    nodes = dict(definitions)
    scope_names: dict[int, RankNames] = {}

    ranked_scopes: dict[int, bool] = {}

    def ranked_scope(scope: _Scope) -> bool:
        """Whether the scope's text can name a rank at all (module-level rank names are read too)."""
        if id(scope) not in ranked_scopes:
            node = nodes.get(scope.name)
            ranked_scopes[id(scope)] = not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or any(
                word in source.text_of(node) for word in RANK_TEXT)
        return ranked_scopes[id(scope)]

    def names_of(scope: _Scope) -> RankNames:
        """The rank names of a scope, read once, only for a scope that calls the project with arguments."""
        if 0 not in scope_names:
            scope_names[0] = RankNames(source.tree.body)
        if id(scope) not in scope_names:
            node = nodes.get(scope.name)
            scope_names[id(scope)] = RankNames(node.body, scope_names[0]) if isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope_names[0]
        return scope_names[id(scope)]

    saves = "save" in text
    for stmt in resolver.assigns:
        counted = owner(stmt.lineno).bindings
        for assigned in stmt.targets:
            for part in ast.walk(assigned):
                if isinstance(part, ast.Name):
                    counted[part.id] = counted.get(part.id, 0) + 1
        if len(stmt.targets) == 1 and isinstance(stmt.value, ast.Call):
            made = resolver.class_of(stmt.value)
            if made is None:
                continue
            if made.name[:1].isupper() and isinstance(stmt.targets[0], ast.Name):
                # `Trainer(...)`: an object of the class; `Trainer.from_config(cfg)`: a factory, maybe
                # returning `cls(...)`; the index decides (`CallGraph.function` on
                # `Trainer.from_config().run`)
                owner(stmt.lineno).objects[stmt.targets[0].id] = Target(made.path, f"{made.name}()") if (
                    "." in made.name) else made
            if id(stmt.value) not in guarded:  # made on some ranks only: not what every caller passes
                _keep_results(owner(stmt.lineno), stmt.targets[0], made)
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
        if saves and scope.save is None and isinstance(func, ast.Attribute) and (
                func.attr == "save") and id(call) not in guarded and source.resolve(func) == "torch.save":
            where = save_destination(call)
            if where is not None and shared_destination(source, where):
                scope.save = Step(
                    f"`torch.save(…, {_short(source.segment(where))})`", source.path, call.lineno
                )
            continue
        found = resolver.callee(func, scope.cls, scope.objects)
        if found is None:
            continue
        target, bound = found
        if ranked and (call.args or call.keywords) and ranked_scope(scope) and not all(
                isinstance(a, ast.Constant) for a in (*call.args, *(k.value for k in call.keywords))):
            rank_args.extend(rank_arguments(call, target, bound, names_of(scope)))
        flows: list[tuple[int | str, int]] = []
        position = scope.position
        if position:
            for i, arg in enumerate(call.args):
                if isinstance(arg, ast.Name) and arg.id in position:
                    flows.append((i, position[arg.id]))
            for kw in call.keywords:
                if kw.arg and isinstance(kw.value, ast.Name) and kw.value.id in position:
                    flows.append((kw.arg, position[kw.value.id]))
        given: list[tuple[int | str, ast.expr]] = [*enumerate(call.args)]
        given += [(kw.arg, kw.value) for kw in call.keywords if kw.arg]
        results = tuple((where, *scope.results[arg.id]) for where, arg in given
                        if isinstance(arg, ast.Name) and arg.id in scope.results
                        and (not _is_object(scope.results[arg.id][0]) or _only_result(scope, arg)))
        receiver = func.value if isinstance(func, ast.Attribute) else None
        # `saver.save()` where `saver` is None on some paths (`saver = Saver()` only under `if is_primary():`)
        # may run on some ranks only: taken as guarded, never as evidence that every rank runs it
        maybe_none = isinstance(receiver, ast.Name) and receiver.id in scope.objects and not _only_result(
            scope, receiver)
        scope.calls.append(CallSite(target, call.lineno, id(call) in guarded or maybe_none, bound,
                                    tuple(flows), results))
    for loop in resolver.loops:
        scope = owner(loop.lineno)
        _iterates_via(scope, loop, resolver)
        walked = iterated(loop.iter)
        path = path_of(walked) if walked is not None and scope.position else None
        if path:
            root = path.split(".", 1)[0].split("[", 1)[0]
            if root in scope.position:
                scope.iterates.append((scope.position[root], path[len(root):], loop.lineno))
    for ret in resolver.returns:  # `return build(...)`: what a project function returns, returned on
        scope = owner(ret.lineno)
        if isinstance(ret.value, ast.Call) and scope.forwards is None and (
                made := resolver.class_of(ret.value)) is not None and made.name[:1].islower():
            scope.forwards = made
        through = iterated(ret.value) if ret.value is not None else None
        if isinstance(through, ast.Name) and through.id in scope.position:  # `return tqdm(iterator)`
            scope.passes_through.add(scope.position[through.id])
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
            factories.get(sc.name, ""),
            sc.forwards,
            tuple(sorted(sc.passes_through)),
            tuple(sc.iterates_via),
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
        imports=frozenset(ref.path for ref in resolver.names.values()
                          if not _beside_src(source.path, ref.path)) | frozenset(resolver.stars),
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
        makes_group=makes_group(source),
        attributes=attribute_bindings(source, resolver.assigns),
        rank_arguments=tuple(rank_args),
        tested_attributes=tested_attributes([*resolver.ifs, *resolver.whiles]),
        asks_program=any(rule.wanted(text) for rule in _program_rules()),
        shards=file_shards(source),
    )


def _factories(resolver: Resolver, definitions: list[tuple[str, ast.AST]]) -> dict[str, str]:
    """Methods whose every `return` makes an object of a class: `return cls(...)` ("cls", the class it is
    called on) or `return Trainer(...)` (a class of the same file)."""
    if not resolver.classes:
        return {}
    found: dict[str, str] = {}
    for name, node in definitions:
        if "." not in name or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        made = set()
        for ret in _own_returns(node.body):
            value = ret.value
            func = value.func if isinstance(value, ast.Call) else None
            own = isinstance(func, ast.Name) and (func.id == "cls" or func.id in resolver.classes)
            made.add(func.id if own and isinstance(func, ast.Name) else "")
        if len(made) == 1 and (only := made.pop()):
            found[name] = only
    return found


def _iterates_via(scope: _Scope, loop: ast.For | ast.AsyncFor, resolver: Resolver) -> None:
    """`for x in wrap(loader, ...)` with `loader` a parameter and `wrap` a project function."""
    call = loop.iter
    if not scope.position or not isinstance(call, ast.Call):
        return
    found = resolver.callee(call.func, scope.cls, scope.objects)
    if found is None:
        return
    for i, arg in enumerate(call.args):
        if isinstance(arg, ast.Name) and arg.id in scope.position:
            scope.iterates_via.append((scope.position[arg.id], found[0], i + (1 if found[1] else 0),
                                       loop.lineno))


def _beside_src(importer: str, imported: str) -> bool:
    """`scripts/train.py` importing `src/pkg/mod.py`: calls into the package are followed, but the script
    and the package are not one program (a library's tests and benchmarks import it the same way)."""
    parts = os.path.abspath(imported).split(os.sep)
    if "src" not in parts[:-1]:
        return False
    root = os.sep.join(parts[: len(parts) - 1 - parts[::-1][1:].index("src")])
    return not os.path.abspath(importer).startswith(root + os.sep)


def _is_object(made: Target) -> bool:
    """A constructor's (or a classmethod factory's) result: an object of a project class."""
    return made.name.partition(".")[0][:1].isupper()


def _only_result(scope: _Scope, name: ast.Name) -> bool:
    """`name` is bound once in its function, to one call's result (`saver = None` on the other ranks and
    `saver = Saver(...)` under `if is_primary(args):` is not one object on every rank)."""
    return scope.bindings.get(name.id, 0) == 1


def _keep_results(scope: _Scope, target: ast.expr, made: Target) -> None:
    """`x = load()` / `a, b = load()`: the names that hold what a project function returned (a name bound
    again later keeps only the last such binding: good enough to follow, never to prove absence)."""
    if isinstance(target, ast.Name):
        scope.results[target.id] = (made, "")
    elif isinstance(target, (ast.Tuple, ast.List)):
        for i, element in enumerate(target.elts):
            if isinstance(element, ast.Name):
                scope.results[element.id] = (made, f"[{i}]")


def _moves_tensors(source: SourceFile, call: ast.Call) -> bool:
    qual = source.resolve(call.func) or ""
    head, _, op = qual.rpartition(".")
    return head.startswith("torch.distributed") and op in COLLECTIVE_WORDS





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

