"""What the first pass (`summarize.py`) reads off a function beside its calls: the factories of a file,
the loops over what a project function passes through, the results it keeps, the collectives its
parameters flow into and the CPU tensors it returns."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from .collectives import TENSOR_ARGS
from .facts import CallSite, FunctionSummary, Step, Target
from .flows import path_of
from .index import Resolver
from .scope import MODULE, _Scope, _short
from .source import call_name, statements
from .summaries import _returns as _own_returns

if TYPE_CHECKING:
    from .source import SourceFile


def _factories(resolver: Resolver, definitions: list[tuple[str, ast.AST]]) -> dict[str, tuple[str, ...]]:
    """Functions whose every `return` makes an object of a project class, with the classes it may be:
    `return cls(...)` ("cls", the class a classmethod is called on), `return Trainer(...)` or `agent =
    Agent(...); return agent` (a class of the file, or one it imports), `return globals()[name](...)`
    (any class the module holds by name: one of several). `return None` makes none and is allowed."""
    held = _module_classes(resolver)
    if not held:
        return {}
    found: dict[str, tuple[str, ...]] = {}
    for name, node in definitions:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        returns = _own_returns(node.body)
        if not returns:
            continue
        method = "." in name
        kept: dict[str, ast.expr] | None = None  # read only when a method returns `cls.<attr>`
        local: dict[str, list[ast.expr]] = {}
        made: set[str] = set()
        for ret in returns:
            value = ret.value
            if value is None or isinstance(value, ast.Constant) and value.value is None:
                continue
            if method and isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and (
                    value.value.id == "cls"):
                if kept is None:  # a singleton: `cls._instance = cls()` then `return cls._instance`
                    kept = {target.attr: stmt.value for stmt in ast.walk(node)
                            if isinstance(stmt, ast.Assign) for target in stmt.targets
                            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == "cls"}
                if value.attr in kept:
                    value = kept[value.attr]
            if isinstance(value, ast.Name):  # `agent = Agent(...)` ... `return agent`
                if not local:
                    local = _bound_names(node)
                values = local.get(value.id, [])
                value = values[0] if len(values) == 1 else value
            classes = _classes_made(value, held, method)
            made.update(classes or ("",))
        if made and "" not in made:
            found[name] = tuple(sorted(made))
    return found


def _module_classes(resolver: Resolver) -> dict[str, str]:
    """The classes a module holds by name (its own, and project classes it imports): local name → the
    class's own name (what the index finds it under)."""
    held = {name: name for name in resolver.classes}
    for local, ref in resolver.names.items():
        member = getattr(ref, "name", None)
        if member and member[:1].isupper() and local not in held:
            held[local] = member
    return held


def _bound_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, list[ast.expr]]:
    bound: dict[str, list[ast.expr]] = {}
    for stmt in statements(function.body):  # an assignment is a statement: no expression walked
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(stmt.value)
    return bound


def _classes_made(value: ast.expr, held: dict[str, str], method: bool) -> tuple[str, ...]:
    """The classes a constructor call may make: `Name(...)`, `cls(...)`, `globals()[key](...)`."""
    if not isinstance(value, ast.Call):
        return ()
    func = value.func
    if isinstance(func, ast.Name):
        if func.id == "cls" and method:
            return ("cls",)
        return (held[func.id],) if func.id in held else ()
    if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Call) and isinstance(
            func.value.func, ast.Name) and func.value.func.id == "globals":
        return tuple(sorted(set(held.values())))  # the key is computed: any class of the module
    return ()


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
    and the package are not one program (a library's tests and benchmarks import it the same way). A `src`
    folder that is itself a package (`src/__init__.py`, imported as `src.models`) is the program's own code,
    not a src layout."""
    parts = os.path.abspath(imported).split(os.sep)
    if "src" not in parts[:-1]:
        return False
    root = os.sep.join(parts[: len(parts) - 1 - parts[::-1][1:].index("src")])
    if os.path.isfile(os.path.join(root, "__init__.py")):  # root: the `src` folder
        return False
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


def _count_binding(scope: _Scope, stmt: ast.Assign | ast.AnnAssign) -> None:
    """How many assignments bind each name of the scope (a name inside a target counts, `x.y = ...`
    included), and the names bound once, to a part of a parameter (`train: DataLoader = loaders["train"]`;
    `scope.parts` maps every name an assignment rebinds, to None after its first binding or for another
    value)."""
    counted = scope.bindings
    for assigned in stmt.targets if isinstance(stmt, ast.Assign) else (stmt.target,):
        if isinstance(assigned, ast.Name):  # most targets: no walk
            counted[assigned.id] = counted.get(assigned.id, 0) + 1
            first = assigned.id not in scope.parts and stmt.value is not None
            scope.parts[assigned.id] = _parameter_part(scope, stmt.value) if first else None  # type: ignore[arg-type]
            if first and isinstance(stmt.value, (ast.Dict, ast.List, ast.Tuple)):
                scope.displays[assigned.id] = stmt.value  # `loaders = {"train": train_loader}`
            else:
                scope.displays.pop(assigned.id, None)
            continue
        for node in ast.walk(assigned):
            if isinstance(node, ast.Name):
                counted[node.id] = counted.get(node.id, 0) + 1
        if isinstance(assigned, (ast.Tuple, ast.List, ast.Starred)):
            for node in ast.walk(assigned):
                if isinstance(node, ast.Name):
                    scope.parts[node.id] = None
                    scope.displays.pop(node.id, None)


def _parameter_part(scope: _Scope, value: ast.expr) -> tuple[int, str] | None:
    """`loaders["train"]` or `loaders` where `loaders` is a parameter: (its position, where in it)."""
    path = path_of(value)
    root = path.split(".", 1)[0].split("[", 1)[0] if path is not None else ""
    if path is None or root not in scope.position or "." in path[len(root):]:
        return None
    return scope.position[root], path[len(root):]


Results = tuple[tuple[int | str, Target, str], ...]
Placed = tuple[tuple[int | str, str, Target, str], ...]
Parts = tuple[tuple[int | str, int, str], ...]


def passed_values(scope: _Scope, given: list[tuple[int | str, ast.expr]]) -> tuple[Results, Placed, Parts]:
    """What a call's arguments hold, for `CallSite`: project functions' results (`fit(loader)` after
    `loader = build()`; an object only where it is the name's one binding), such results inside a
    dict, list or tuple display, and the caller's own parameters or parts of them, directly or through a
    name bound once to one (the walks follow these to the callers' callers)."""
    results: list[tuple[int | str, Target, str]] = []
    placed: list[tuple[int | str, str, Target, str]] = []
    parts: list[tuple[int | str, int, str]] = []
    for where, arg in given:
        if isinstance(arg, ast.Name) and arg.id in scope.results and (
                not _is_object(scope.results[arg.id][0]) or _only_result(scope, arg)):
            results.append((where, *scope.results[arg.id]))
        elif isinstance(arg, (ast.Dict, ast.List, ast.Tuple)) or (
                isinstance(arg, ast.Name) and arg.id in scope.displays):
            shown = scope.displays[arg.id] if isinstance(arg, ast.Name) else arg
            items: list[tuple[object, ast.expr]] = [
                (k.value if isinstance(k, ast.Constant) else None, v) for k, v in zip(
                    shown.keys, shown.values, strict=True)] if isinstance(shown, ast.Dict) else list(
                enumerate(shown.elts if isinstance(shown, (ast.List, ast.Tuple)) else ()))
            for key, item in items:
                if isinstance(key, (str, int)) and isinstance(item, ast.Name) and item.id in scope.results:
                    placed.append((where, f"[{key!r}]", *scope.results[item.id]))
        elif isinstance(arg, ast.Name) and (part := scope.parts.get(arg.id)) is not None:
            parts.append((where, *part))
        elif (part := _parameter_part(scope, arg)) is not None and scope.params[part[0]] not in scope.parts:
            parts.append((where, *part))  # (a parameter bound again is no longer what the callers gave)
    return tuple(results), tuple(placed), tuple(parts)


def _registries(resolver: Resolver) -> dict[str, FunctionSummary]:
    """`PIPELINES = {"train": TrainingPipeline, ...}`: `PIPELINES[]`, a function that calls each value (a
    call through the registry calls one of them; `Resolver.registries`)."""
    out: dict[str, FunctionSummary] = {}
    for name, values in resolver.registries.items():
        sites = tuple(CallSite(found[0], value.lineno, False, False) for value in values
                      if (found := resolver.callee(value, None)) is not None)
        if sites:
            line = values[0].lineno
            out[f"{name}[]"] = FunctionSummary(f"{name}[]", line, (), None, None, (), sites, False)
    return out


def _kept_result(scope: _Scope, value: ast.expr | None) -> Target | None:
    """`loader = create_loader(...)` then `return loader`: the project function whose whole result is
    returned (the last binding kept, as `_keep_results` keeps it)."""
    held = scope.results.get(value.id) if isinstance(value, ast.Name) else None
    return held[0] if held is not None and held[1] == "" else None


def _moves_tensors(source: SourceFile, call: ast.Call) -> bool:
    qual = source.resolve(call.func) or ""
    head, _, op = qual.rpartition(".")
    return head.startswith("torch.distributed") and op in TENSOR_ARGS  # the collectives that move tensor data





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
        if call_name(call) not in TENSOR_ARGS:
            continue
        scope = owner(call.lineno)
        if not scope.position:
            continue
        qual = source.resolve(call.func) or ""
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

