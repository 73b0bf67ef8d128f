"""The first pass: one file read once into its `ModuleSummary` (its project imports, and per function the
collective it issues, the checkpoint it writes, the parameters it iterates, the project calls it makes and
which of its parameters flow into them, what it returns in the rank domain). No AST outlives it."""

from __future__ import annotations

import ast
import bisect
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from .argument_shapes import NotNone
from .attributes import RankArgument, attribute_bindings, rank_arguments, tested_attributes
from .collectives import TENSOR_ARGS, TRIGGERS, CollectiveCalls
from .constant_gates import compares_a_name, constants_of, given_constants
from .decorators import gates_of
from .delegated_hooks import delegated_hooks
from .epoch_calls import set_epoch_calls
from .facts import CallSite, FunctionSummary, ModuleSummary, Step, Target
from .flags import flag_bindings
from .flows import iterated, path_of
from .guards import RankFlow
from .helper_tests import helper_tests
from .index import ProjectFiles, Resolver
from .loaders import _class_loops, _loader_builders
from .metric_objects import derives_from_torchmetrics
from .model_wrappers import WORDS as WRAPPER_WORDS
from .model_wrappers import keeps_buffers, wrapper_returns
from .nested import LOCALS, nested_functions
from .pipeline_stages import builds_pipeline
from .program import launched, lightning_runs_every_rank, makes_group
from .rank_paths import holds_rank
from .ranks import RankNames
from .scope import MODULE, _Scope, _scope, _short
from .scope_facts import (
    _beside_src,
    _collective_params,
    _count_binding,
    _cpu_returns,
    _factories,
    _iterates_via,
    _keep_results,
    _kept_result,
    _moves_tensors,
    _only_result,
    _registries,
    passed_values,
)
from .scripts import handed_on, main_block, node_launches
from .sharding import file_shards
from .source import UTILITY_MODULES
from .subgroups import collective_group
from .summaries import FILE_WORDS, returned_ranks
from .wrapped import ddp_wrapped_classes
from .writes import WRITE_WORDS, checkpoint_write, destination, shared_destination

if TYPE_CHECKING:
    from .registry import Rule
    from .source import SourceFile

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


# Words a file that writes a checkpoint must hold (writes.FILE_WRITERS, `save_pretrained`): the cheap
# pre-filter of the summary's writes.


def runs_epochs_for_you(qualname: str) -> bool:
    # (`from accelerate.utils import set_seed` runs nothing: a utility module is no framework)
    return qualname.startswith(FRAMEWORK_PACKAGES) and not qualname.startswith(UTILITY_MODULES) or (
        qualname.startswith(TRAINER_PACKAGES) and qualname.endswith("Trainer"))


def guarded_calls(source: SourceFile) -> set[int]:
    """ids of the calls of a file that run under a rank test (or after an early exit of the others)."""
    flow = RankFlow(source, lambda branch, cls: False)
    return {id(g.call) for g in flow.calls if g.guard is not None and not g.guard.trusted}


def summarize(source: SourceFile, files: ProjectFiles) -> ModuleSummary:
    """One pass over the file's calls (shared with the rules) and statements, each attributed to the
    function or method whose lines hold it. A nested function is a function of its own (nested.py): its
    calls are its own, and it runs where its parent calls it or where the function it is passed to calls
    it. (Its loops and returns still count as its parent's: the loader and return facts are not moved.)"""
    from .backends import FRAMEWORK_INIT_WORDS, FRAMEWORK_WORDS, nccl_inits  # DDP301's backends, shared

    text = source.text
    resolver = source.project.resolver(source) if source.project is not None else Resolver(source, files)
    labels = CollectiveCalls(source) if any(t in text for t in TRIGGERS) else None
    guarded = guarded_calls(source) if any(w in text for w in ("rank", "_zero", "main_process")) else set()
    tested = helper_tests(resolver, resolver.ifs)  # rank tests through a helper, settled by the index
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
    nested = nested_functions(source)
    by_function: dict[ast.AST, _Scope] = {node: sc for sc, (_, node) in zip(scopes, definitions, strict=True)}
    inner_nodes: dict[str, ast.AST] = {}
    for inner in sorted(nested.parent, key=lambda f: f.lineno):
        qualname = nested.names[inner]
        top = qualname.split(LOCALS, 1)[0]
        by_function[inner] = _scope(inner, qualname, top.split(".", 1)[0] if "." in top else None)
        inner_nodes[qualname] = inner
        scopes.append(by_function[inner])
    for inner, defining in nested.parent.items():
        by_function[inner].parent = by_function[defining]
    returned = returned_ranks(source, resolver, definitions) if any(w in text for w in FILE_WORDS) else {}
    gates = gates_of(source, definitions, returned)  # decorators running what they decorate on some ranks
    factories = _factories(resolver, definitions) if "return" in text else {}
    scopes.sort(key=lambda sc: sc.line)
    starts = [sc.line for sc in scopes]
    module = _Scope(MODULE, 0, 0, None, (), False)

    def owner(line: int) -> _Scope:
        """The innermost function whose lines hold `line` (a nested function's own, not its parent's)."""
        i = bisect.bisect_right(starts, line) - 1
        found: _Scope | None = scopes[i] if i >= 0 else None
        while found is not None and line > found.end:
            found = found.parent
        return found or module

    def outer(line: int) -> _Scope:
        """The top-level function or method whose lines hold `line`: for the facts not yet kept per nested
        function (loops, returns, the loader and tensor facts)."""
        found = owner(line)
        while found.parent is not None:
            found = found.parent
        return found

    ranked = any(word in text for word in FILE_WORDS)
    rank_args: list[RankArgument] = []
    nodes = dict(definitions)
    nodes.update(inner_nodes)
    shapes: dict[str, NotNone] = {}

    def not_none(name: str) -> NotNone:
        """What of a function's names is known not to be None (argument_shapes.py), read on first ask."""
        if name not in shapes:
            shapes[name] = NotNone(nodes.get(name))
        return shapes[name]
    scope_names: dict[int, RankNames] = {}

    ranked_scopes: dict[int, bool] = {}

    def ranked_scope(scope: _Scope) -> bool:
        """Whether the scope's text can name a rank at all (module-level rank names are read too)."""
        if id(scope) not in ranked_scopes:
            node = nodes.get(scope.name)
            ranked_scopes[id(scope)] = not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or any(
                word in source.text_of(node) for word in FILE_WORDS)
        return ranked_scopes[id(scope)]

    def names_of(scope: _Scope) -> RankNames:
        """The rank names of a scope, read once, only for a scope that calls the project with arguments."""
        if 0 not in scope_names:
            scope_names[0] = RankNames(source.tree.body)
        if id(scope) not in scope_names:
            node = nodes.get(scope.name)
            outside = names_of(scope.parent) if scope.parent else scope_names[0]  # a closure sees its parent
            scope_names[id(scope)] = RankNames(node.body, outside) if isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope_names[0]
        return scope_names[id(scope)]

    saves = any(word in text for word in WRITE_WORDS)
    bindings: list[ast.Assign | ast.AnnAssign] = [*resolver.assigns]
    for stmt in (*bindings, *(s for s in resolver.other_assigns if isinstance(s, ast.AnnAssign))):
        _count_binding(owner(stmt.lineno), stmt)
        if not isinstance(stmt, ast.Assign):
            continue
        if len(stmt.targets) == 1 and isinstance(stmt.value, ast.Call):
            made = resolver.class_of(stmt.value)
            if made is None:
                continue
            if isinstance(stmt.targets[0], ast.Name) and (made.name[:1].isupper() or "." not in made.name):
                # `Trainer(...)`: an object of the class; `Trainer.from_config(cfg)` or `load_model(args)`:
                # a factory, maybe returning `cls(...)` or an object of one of the classes its module
                # holds; the index decides (`CallGraph.function` on `Trainer.from_config().run`)
                owner(stmt.lineno).objects[stmt.targets[0].id] = made if made.name[:1].isupper() and (
                    "." not in made.name) else Target(made.path, f"{made.name}()")
            if id(stmt.value) not in guarded:  # made on some ranks only: not what every caller passes
                _keep_results(owner(stmt.lineno), stmt.targets[0], made)
    if nested:  # a closure sees what its parents bound, where it does not bind the name itself
        for sc in scopes:  # (parents first: sorted by line)
            if sc.parent is None:
                continue
            for name, made in sc.parent.objects.items():
                if name not in sc.bindings:
                    sc.objects.setdefault(name, made)
            for name, held in sc.parent.results.items():
                if name not in sc.bindings:
                    sc.results.setdefault(name, held)
            for name, count in sc.parent.bindings.items():
                sc.bindings.setdefault(name, count)
    for call in source.calls:
        scope = owner(call.lineno)
        if scope.position:  # `model(x)` on a parameter: a caller passing a wrapped model runs its pass here
            called = call.func.value if isinstance(call.func, ast.Attribute) and call.func.attr in (
                "forward", "generate") else call.func
            if isinstance(called, ast.Name) and called.id in scope.position:
                scope.runs_params.add(scope.position[called.id])
                if called is call.func:  # `fn(path)`: a callable passed in runs here (nested.py)
                    scope.calls_params.add((scope.position[called.id], id(call) in guarded))
        if (
            labels is not None
            and scope.collective is None
            and not scope.rank_zero_only
            and scope is not module
        ):
            label = labels.label(call)
            if label is not None:
                scope.collective = Step(f"`{label}`", source.path, call.lineno)
                scope.collective_group = collective_group(call)
                continue
        func = call.func
        written = checkpoint_write(source, call) if saves else None
        if written is not None and scope.save is None and id(call) not in guarded:
            writer, where = written
            where = destination(source, call, where) if where is not None else None
            if where is not None and shared_destination(source, where) and not holds_rank(source, where):
                scope.save = Step(f"`{writer}(…, {_short(source.segment(where))})`", source.path, call.lineno,
                                  writer)
            continue
        within = nodes.get(scope.name) if nested else None
        local = nested.called(call, within) if within is not None else None  # type: ignore[arg-type]
        found = (Target(source.path, nested.names[local]), False) if local is not None else resolver.callee(
            func, scope.cls, scope.objects)
        if found is None:
            continue
        target, bound = found
        if within is not None:  # `save_if_main(write, path)`: `write` runs where `save_if_main` calls it
            scope.passes.extend(
                CallSite(Target(source.path, nested.names[given.function]), call.lineno, id(call) in guarded,
                         False, passed_to=(target, given.argument, bound))
                for given in nested.passed(call, within))  # type: ignore[arg-type]
        if (call.args or call.keywords) and not all(
                isinstance(a, ast.Constant) for a in (*call.args, *(k.value for k in call.keywords))):
            rank_args.extend(rank_arguments(
                call, target, bound, names_of(scope) if ranked and ranked_scope(scope) else None,
                _project_calls(resolver, scope)))
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
        results, placed, parts = passed_values(scope, given)
        receiver = func.value if isinstance(func, ast.Attribute) else None
        # `saver.save()` where `saver` is None on some paths (`saver = Saver()` only under `if is_primary():`)
        # may run on some ranks only: taken as guarded, never as evidence that every rank runs it
        maybe_none = isinstance(receiver, ast.Name) and receiver.id in scope.objects and not _only_result(
            scope, receiver)
        constants, arity = given_constants(call, not_none(scope.name))
        scope.calls.append(CallSite(target, call.lineno, id(call) in guarded or maybe_none, bound,
                                    tuple(flows), results, constants, arity, placed=placed, parts=parts,
                                    helper_tests=tested.get(id(call), ())))
    # Functions whose tests compare a parameter with a constant: read again per constant (constant_gates.py).
    gated = {id(outer(test.lineno)) for test in resolver.ifs if compares_a_name(test.test)}
    for loop in resolver.loops:
        scope = outer(loop.lineno)
        _iterates_via(scope, loop, resolver)
        walked = iterated(loop.iter)
        path = path_of(walked, any_key=True) if walked is not None and scope.position else None
        if path:
            root = path.split(".", 1)[0].split("[", 1)[0]
            if root in scope.position:
                scope.iterates.append((scope.position[root], path[len(root):], loop.lineno))
    for ret in resolver.returns:  # `return build(...)`: what a project function returns, returned on
        scope = outer(ret.lineno)
        value = ret.value
        made = resolver.class_of(value) if isinstance(value, ast.Call) else _kept_result(scope, value)
        if scope.forwards is None and made is not None and made.name[:1].islower():
            scope.forwards = made
        through = iterated(ret.value) if ret.value is not None else None
        if isinstance(through, ast.Name) and through.id in scope.position:  # `return tqdm(iterator)`
            scope.passes_through.add(scope.position[through.id])
    loader_attributes: list[tuple[str, int]] = []
    if "DistributedSampler" in text:
        loader_attributes = _loader_builders(source, resolver, outer)
    if "distributed" in text and any(word in text for word in COLLECTIVE_WORDS):
        _collective_params(source, resolver, outer)
    if "torch" in text and resolver.returns:
        _cpu_returns(source, resolver, outer)
    if "in self." in text:
        _class_loops(source, resolver, outer, [sc for sc in scopes if sc.parent is None])
    if resolver.returns and any(word in text for word in WRAPPER_WORDS):
        wrapper_returns(source, resolver, outer)
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
            factories.get(sc.name, ()),
            sc.forwards,
            tuple(sorted(sc.passes_through)),
            tuple(sc.iterates_via),
            sc.returns_wrapper,
            tuple(sorted(sc.runs_params)),
            *constants_of(nodes.get(sc.name), sc.params, id(sc) in gated,
                           lambda c: labels is not None and labels.label(c) is not None),
            calls_params=tuple(sorted(sc.calls_params)),
            passes=tuple(sc.passes), collective_group=sc.collective_group, rank_gate=gates.get(sc.name),
        )
        for sc in (*scopes, module)
    }
    for cls, bases in resolver.classes.items():  # inherited methods: project base classes, in order
        refs = [ref[0] for base in bases if isinstance(base, (ast.Name, ast.Attribute))
                and (ref := resolver.callee(base, None)) is not None]
        if refs:
            functions[f"{cls}.__bases__"] = FunctionSummary(f"{cls}.__bases__", 0, (), None, None, (), tuple(
                CallSite(r, 0, False, False) for r in refs), False)
    functions.update(_registries(resolver) if "{" in text else {})
    return ModuleSummary(
        path=source.path,
        functions=functions,
        imports=frozenset(ref.path for ref in resolver.names.values()
                          if not _beside_src(source.path, ref.path)) | frozenset(resolver.stars),
        stars=frozenset(resolver.stars),
        loader_attributes=tuple(loader_attributes),
        set_epoch=bool(set_epoch_calls(source)),
        trains="backward(" in text,
        framework=any(runs_epochs_for_you(q) for q in source.imports.names.values()),
        inits=tuple(nccl_inits(source))
        if "init_process_group" in text or any(w in text for w in FRAMEWORK_WORDS + FRAMEWORK_INIT_WORDS)
        else (),
        samplers="DistributedSampler" in text,
        collectives="distributed" in text
        and any(word in text for word in COLLECTIVE_WORDS)
        and any(_moves_tensors(source, c) for c in source.calls),
        manual_ddp=("init_process_group" in text or "DistributedDataParallel" in text or ".module" in text)
        and source.manual_ddp,
        launched=launched(source),
        makes_group=makes_group(source),
        pipeline=builds_pipeline(source), delegated_hooks=delegated_hooks(source),
        lightning_processes=lightning_runs_every_rank(source),
        attributes=attribute_bindings(source, resolver.assigns, resolver),
        rank_arguments=tuple(rank_args),
        tested_attributes=tested_attributes([*resolver.ifs, *resolver.whiles]),
        asks_program=any(rule.wanted(text) for rule in _program_rules()),
        shards=file_shards(source),
        keeps_buffers=keeps_buffers(text),
        flags=flag_bindings(source.tree, [*resolver.assigns, *resolver.other_assigns], source.calls),
        maybe_imports=frozenset(resolver.unresolved - {source.path}),
        main_block=main_block(source.tree) if "__main__" in text else None, handed_on=handed_on(source.tree),
        node_launches=node_launches(source.tree) if "--n" in text else (),
        metric_classes=derives_from_torchmetrics(source),
        device_managed=frozenset(source.lightning_modules | ddp_wrapped_classes(source)),
        passes_closures=any(sc.passes for sc in scopes), helper_tested=bool(tested),
    )


def _project_function(found: tuple[Target, bool] | None) -> Target | None:
    """A project function (not a class: an object is no rank test) that a call resolves to."""
    if found is None or found[0].name[:1].isupper() and "." not in found[0].name:
        return None
    return found[0]


def _project_calls(resolver: Resolver, scope: _Scope) -> Callable[[ast.expr], Target | None]:
    return lambda func: _project_function(resolver.callee(func, scope.cls, scope.objects))
