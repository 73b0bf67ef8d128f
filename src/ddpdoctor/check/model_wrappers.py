"""Which names of a file hold a model wrapped for data-parallel training, and by which wrapper: the call
itself (`model = FSDP(net)`, `engine, *_ = deepspeed.initialize(...)`, `fully_shard(model)` in place), or a
project function whose every `return` gives such a wrapper (`model = wrap_model(model)` with
`def wrap_model(m): return DistributedDataParallel(m, ...)`, in this file or another).

DDP104 asks it: every forward of a wrapped model may be a collective. A sharded model all-gathers its
parameters; a `DistributedDataParallel` model broadcasts its buffers from rank 0 before the forward
(torch 2.13 `DistributedDataParallel._pre_forward` → `_sync_buffers` when `will_sync_module_buffers()`:
`broadcast_buffers=True`, the default, the module has buffers, and the last forward ran with gradients).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING

from .source import SourceFile, dotted, statements
from .values import scope_of_calls

if TYPE_CHECKING:
    from .index import Resolver
    from .scope import _Scope

WORDS = ("DistributedDataParallel", "FullyShardedDataParallel", "fully_shard", "deepspeed", ".prepare(")
# Text that registers module buffers: `register_buffer` itself and the layers that keep running statistics.
_BUFFERS = re.compile(r"\bregister_buffer\(|BatchNorm|InstanceNorm\w*\(.*track_running_stats=True")


class Wrapper(Enum):
    DDP = "DistributedDataParallel"
    FSDP = "FullyShardedDataParallel"
    FULLY_SHARD = "fully_shard"
    DEEPSPEED = "deepspeed.initialize"
    # `accelerator.prepare(model, ...)`: DistributedDataParallel on several processes (FSDP or DeepSpeed when
    # the launch config says so, which the file need not show); a buffer broadcast at least
    ACCELERATE = "Accelerator.prepare"

    @property
    def sharded(self) -> bool:
        return self not in (Wrapper.DDP, Wrapper.ACCELERATE)


# DeepSpeed shards parameters, and so gathers them in every forward, only under ZeRO stage 3: what a file
# shows of it (a config dict's `"stage": 3`, `zero_stage=3`, the stage-3 keys, `deepspeed.zero.Init`).
_ZERO3 = re.compile(r"""["']stage["']\s*:\s*3\b|\b(zero_)?stage\s*==?\s*3\b|\bzero3\b|ZeRO-?3|zero\.Init\b"""
                    r"|stage3_|is_deepspeed_zero3_enabled")


def zero3_shown(text: str) -> bool:
    # every alternative holds one of these words (the regex alone has no literal to skip to)
    return any(word in text for word in ("stage", "zero3", "ZeRO", "zero.Init")) and _ZERO3.search(
        text) is not None


def keeps_buffers(text: str) -> bool:
    """The file defines modules with buffers (a registered buffer, a BatchNorm layer)."""
    if "BatchNorm" in text:
        return True
    # the regex has no literal to skip to: tried at every character of every file, it cost more than the
    # summary's other text tests together
    return ("register_buffer(" in text or "InstanceNorm" in text) and _BUFFERS.search(text) is not None


def wrapper_call(source: SourceFile, call: ast.Call) -> Wrapper | None:
    """The wrapper a call makes, when it is one. A `DistributedDataParallel(..., broadcast_buffers=False)`
    is not counted: its forward issues no collective."""
    resolved = source.resolve(call.func) or ""
    last = resolved.rsplit(".", 1)[-1]
    if last == "fully_shard" and "fsdp" in resolved:
        return Wrapper.FULLY_SHARD
    if last == "FullyShardedDataParallel":
        return Wrapper.FSDP
    if resolved == "deepspeed.initialize":
        return Wrapper.DEEPSPEED
    if last == "DistributedDataParallel" and resolved.startswith("torch."):
        if any(k.arg == "broadcast_buffers" and isinstance(k.value, ast.Constant) and k.value.value is False
               for k in call.keywords):
            return None
        return Wrapper.DDP
    return None


def _prepared(source: SourceFile, node: ast.Assign) -> list[str]:
    """The names bound to what `accelerator.prepare(...)` returns (`model, opt, dl = accelerator.prepare(
    model, opt, dl)`): each may be the prepared model; only a model is ever called (`model(x)`), so a
    prepared optimizer or loader never matches a forward."""
    call = node.value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == "prepare"):
        return []
    receiver = dotted(call.func.value) or ""
    if receiver.rsplit(".", 1)[-1].lstrip("_") != "accelerator" or not source.uses("accelerate"):
        return []
    names = []
    for target in node.targets:
        for element in target.elts if isinstance(target, ast.Tuple) else [target]:
            name = dotted(element) if isinstance(element, (ast.Name, ast.Attribute)) else None
            if name:
                names.append(name)
    return names


def _bound_name(target: ast.expr, wrapper: Wrapper) -> str | None:
    if wrapper is Wrapper.DEEPSPEED and isinstance(target, ast.Tuple) and target.elts:
        target = target.elts[0]  # engine, optimizer, loader, scheduler = deepspeed.initialize(...)
    return dotted(target) if isinstance(target, (ast.Name, ast.Attribute)) else None


def wrapped_names(source: SourceFile) -> dict[str, Wrapper]:
    """The names (`model`, `self.model`) this file binds to a wrapped model, with the wrapper, wherever in
    the file; `unwrapped_here` says where a plain name is not (yet) the wrapper."""
    returned = _project_returns(source)
    names: dict[str, Wrapper] = {}
    for node in statements(source.tree.body):  # assignments and expression statements: no expression walked
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            wrapper = wrapper_call(source, node.value) or returned(node.value)
            if wrapper is None:
                names.update(dict.fromkeys(_prepared(source, node), Wrapper.ACCELERATE))
                continue
            for target in node.targets:
                name = _bound_name(target, wrapper)
                if name:
                    names[name] = wrapper
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and node.value.args:
            if wrapper_call(source, node.value) is Wrapper.FULLY_SHARD:  # in place: the module is sharded
                name = dotted(node.value.args[0])
                if name:
                    names[name] = Wrapper.FULLY_SHARD
    return names


def unwrapped_here(source: SourceFile, name: ast.Name) -> bool:
    """Every binding of `name` that reaches this use in its scope is known, and none makes a wrapper: a
    forward on the model before `model = DDP(model)` is a plain module's (the value core's bindings, so a
    wrapper made on one path of an `if` still counts)."""
    bound = scope_of_calls(source)(name).at(name).get(name.id)
    if not bound:
        return False  # a global, a parameter of an unknown caller: the file's binding stands
    returned = _project_returns(source)
    return all(
        b.value is not None and b.parameter is None
        and not (isinstance(b.value, ast.Call) and (wrapper_call(source, b.value) or returned(b.value)))
        for b in bound
    )


def _project_returns(source: SourceFile) -> Callable[[ast.Call], Wrapper | None]:
    """What a call of a project function returns in this domain (its summary's `returns_wrapper`)."""
    project = source.project
    if project is None:
        return lambda call: None
    resolver = project.resolver(source)

    def returned(call: ast.Call) -> Wrapper | None:
        if not isinstance(call.func, (ast.Name, ast.Attribute)):
            return None
        found = resolver.callee(call.func, None)
        made = project.returns_wrapper(found[0]) if found is not None else None
        return Wrapper(made) if made else None

    return returned


def wrapper_returns(source: SourceFile, resolver: Resolver, owner: Callable[[int], _Scope]) -> None:
    """Functions that may return a wrapped model, of one wrapper: the wrapper's call, or a name the
    function binds to one (`if distributed: model = DDP(model)` ... `return model`: a wrapper in the runs
    that matter). First pass; `scope.returns_wrapper` holds the wrapper's value."""
    returns: dict[int, tuple[_Scope, list[ast.expr | None]]] = {}
    for ret in resolver.returns:
        scope = owner(ret.lineno)
        returns.setdefault(id(scope), (scope, []))[1].append(ret.value)
    bound: dict[tuple[int, str], set[Wrapper | None]] = {}
    for stmt in resolver.assigns:
        if not isinstance(stmt.value, ast.Call):
            continue
        wrapper = wrapper_call(source, stmt.value)
        for target in stmt.targets:
            name = _bound_name(target, wrapper) if wrapper is not None else dotted(target)
            if name:
                bound.setdefault((id(owner(stmt.lineno)), name), set()).add(wrapper)
    for scope, values in returns.values():
        made: set[Wrapper | None] = set()
        for value in values:
            if isinstance(value, ast.Call):
                made.add(wrapper_call(source, value))
            elif isinstance(value, (ast.Name, ast.Attribute)):
                made |= bound.get((id(scope), dotted(value) or ""), {None})
            else:
                made.add(None)
        made.discard(None)  # `return model` where only the distributed branch wrapped it: a wrapper there
        if len(made) == 1:
            wrapper = made.pop()
            assert wrapper is not None
            scope.returns_wrapper = wrapper.value


def pass_in_method(call: ast.Call, cls: ast.ClassDef | None, names: dict[str, Wrapper],
                   pass_of: Callable[[ast.Call, dict[str, Wrapper]], tuple[str, Wrapper] | None]
                   ) -> tuple[ast.expr, tuple[str, Wrapper]] | None:
    """`self.samples(batch)`: a method of the same class that runs a pass of a sharded model kept on an
    attribute (`self.policy.generate(...)`), in its body or through the class's other methods, at any
    depth (DDP104 follows it as DDP101 follows a helper): the call's function, and the pass."""
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))} if (
        cls is not None) else {}
    stack, seen = [call], set()
    while stack:
        func = stack.pop().func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.value.id == "self" and func.attr in methods) or func.attr in seen:
            continue
        seen.add(func.attr)
        for inner in ast.walk(methods[func.attr]):
            if isinstance(inner, ast.Call):
                found = pass_of(inner, names)
                if found is not None and found[1].sharded:
                    return call.func, found
                stack.append(inner)
    return None
