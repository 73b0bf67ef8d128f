"""Loaders over a DistributedSampler that shuffles, followed where a file keeps them: in names, tuples,
dicts and attributes, out of builders, and into the epoch loops of a class (for DDP501 and its summary)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .facts import Step
from .flows import ANY_KEY, Chain, ClassLoops, iterated, path_of, stored_parameters, suffix_after
from .samplers import Shuffles, is_distributed_sampler, sampler_shuffles
from .scope import MODULE, _Scope, _short
from .source import call_name, keyword

if TYPE_CHECKING:
    from .index import Resolver
    from .source import SourceFile


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
    if sampler is None:  # `DataLoader(**params)` after `params["sampler"] = DistributedSampler(...)`
        return any(kw.arg is None and (path := path_of(kw.value)) is not None and f"{path}['sampler']" in
                   samplers for kw in value.keywords)
    return shuffling_sampler(sampler.value, source) or path_of(sampler.value) in samplers


def sampler_entries(stmt: ast.Assign, samplers: set[str], source: SourceFile | None = None) -> list[str]:
    """`loader_args = {"batch_size": 32, "sampler": sampler}` (or `dict(sampler=...)`) where the value is a
    shuffling DistributedSampler or a path bound to one: the paths it binds to the sampler
    (`loader_args['sampler']`), which `DataLoader(ds, **loader_args)` then receives."""
    value = stmt.value
    if isinstance(value, ast.Dict):
        entries = [(k.value, v) for k, v in zip(value.keys, value.values, strict=True)
                   if isinstance(k, ast.Constant) and k.value == "sampler"]
    elif isinstance(value, ast.Call) and call_name(value) == "dict" and not value.args:
        entries = [(kw.arg, kw.value) for kw in value.keywords if kw.arg == "sampler"]
    else:
        return []
    if not any(shuffling_sampler(v, source) or path_of(v) in samplers for _, v in entries):
        return []
    return [p + "['sampler']" for t in stmt.targets if (p := path_of(t))]


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
    if isinstance(value, ast.DictComp):  # `{split: DataLoader(...) for split in splits}`: every key
        held = held_loaders(value.value, samplers, loaders, depth + 1, source)
        return [f"{ANY_KEY}{rest}" for rest in held]
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
        path = path_of(target, any_key=True)  # `loaders[name] = DataLoader(...)` binds `loaders[*]`
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
    for stmt in resolver.assigns:  # `loader_args = {"sampler": sampler}`, for `DataLoader(**loader_args)`
        if entries := sampler_entries(stmt, samplers.get(id(owner(stmt.lineno)), set()), source):
            samplers.setdefault(id(owner(stmt.lineno)), set()).update(entries)
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

