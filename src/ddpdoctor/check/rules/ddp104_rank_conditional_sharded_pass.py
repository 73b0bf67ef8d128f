from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..guards import RankFlow
from ..model_wrappers import (
    Wrapper,
    keeps_buffers,
    pass_in_method,
    unwrapped_here,
    wrapped_names,
    zero3_shown,
)
from ..pins import Ceiling, declared_ceiling
from ..rank_sources import _role_of_method, _role_of_name
from ..registry import Rule, register
from ..source import SourceFile, child_nodes, dotted

_PASS_METHODS = ("forward", "generate", "backward")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@register
class RankConditionalShardedPass(Rule):
    """
    ## What it does
    Finds a forward or backward pass of a sharded model that only some ranks run: a call of a model
    wrapped by `fully_shard`, `FullyShardedDataParallel` or `deepspeed.initialize` (`model(x)`,
    `model.forward(...)`, `model.generate(...)`, `engine.backward(loss)`), or a `.backward()` in a file
    that shards a model, under a rank test (`if rank == 0:`), in a `rank_zero_only` function, or after a
    rank branch that lets some ranks leave; `generate(..., synced_gpus=False)` on a sharded model, where
    each rank's generation ends on its own. As a warning, hedged: a `for` over this rank's slice of the
    data (`data[rank::world_size]`, or a name bound to one) around such a forward, whose length differs
    between ranks whenever the data does not divide evenly. Also the forward of a `DistributedDataParallel`
    model under a rank test, in a program whose modules have buffers, and of a model that
    `accelerator.prepare(...)` returned (DistributedDataParallel on several processes). The wrapper may be
    made in a project function that returns it (`model = wrap(model)`), in this file or another.

    ## Why is this bad?
    A sharded model keeps each parameter split across the ranks. Every forward all-gathers the parameters
    before each wrapped module runs, and every backward reduce-scatters the gradients (and all-gathers again
    what the forward resharded): each pass is a series of collectives every rank must join. Run on rank 0
    alone, rank 0 waits in the first all-gather forever while the others have gone on, and the stack names
    FSDP's or DeepSpeed's internals, not this line. A `DistributedDataParallel` model keeps whole
    parameters, but its forward broadcasts the module's buffers (BatchNorm statistics, registered buffers)
    from rank 0 first, whenever the last forward ran with gradients (torch's `_pre_forward` →
    `_sync_buffers`; `broadcast_buffers=True` is the default): rank 0's evaluation on the DDP model waits
    in that broadcast.

    ## Example
    ```python
    model = fully_shard(model)
    if dist.get_rank() == 0:
        sample = model(prompt)          # rank 0 all-gathers alone
    ```

    ## Use instead
    ```python
    model = fully_shard(model)
    sample = model(prompt)              # every rank runs the pass
    if dist.get_rank() == 0:
        print(sample)                   # only the side effect is rank 0's
    ```

    ## Known problems
    The wrapped model is known by its name in this file (`model = fully_shard(...)`, `fully_shard(model)`,
    `engine, *_ = deepspeed.initialize(...)`, an attribute such as `self.model`, or `model = setup(model)`
    where the project function may return a wrapper): a wrapped model handed to a project function
    (`evaluate(model)`) counts where that function, or one it hands the model on to, calls it (`model(x)`,
    `model.forward`, `model.generate`), and a method of the same class called under the rank test (`if
    self.rank == 0: self.samples(batch)`) counts where it, or a method of the class it calls, runs a pass of
    a sharded model kept on an attribute; a model that reaches this file as a parameter is not known as
    wrapped. A forward that no binding of the wrapper reaches (before `model = DDP(model)`) is a plain
    module's. A DDP model counts when any module of the program (the files joined to this one by imports)
    registers a buffer or builds a BatchNorm layer, not only the wrapped one; a `broadcast_buffers=False`
    written in the call turns it off. A `.backward()` is counted as the sharded model's when the file shards
    a model at all. DeepSpeed shards parameters only under ZeRO stage 3, so a DeepSpeed engine's forward
    counts only where the file shows stage 3 (`"stage": 3` in a config dict, `zero_stage=3`, the `stage3_`
    keys, `deepspeed.zero.Init`): a stage read from a JSON file is not seen; its backward always counts (it
    reduces gradients), unless the loss is made right there by another model (`reference(x).backward()`).
    Ranks that run a different number of passes in a loop of per-rank length, and `generate()` stopping at
    different lengths, are not found here (the guard counts passes at run time). `generate()` is reported
    outside a rank test only with an explicit `synced_gpus=False`: left to its default, transformers turns
    the sync on by itself for a model under DeepSpeed ZeRO-3 or FSDP when the world has more than one rank
    (`GenerationMixin.generate`: `synced_gpus = (is_deepspeed_zero3_enabled() or
    is_fsdp_managed_module(self)) and world_size > 1`, since PR #33483; releases up to 4.45 did so for ZeRO-3
    only). So an FSDP model's `generate()` without `synced_gpus` is reported, as a hedged warning, where the
    project declares a transformers that old (`transformers==4.31.0`, `<4.40` in the nearest
    `requirements*.txt`, `setup.py`, `pyproject.toml` or conda environment above the file: `pins.py`); where
    it declares none, or a newer one, it is not.

    ## Fix safety
    No automatic fix: which result rank 0 needs depends on the program.

    ## References
    - <https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html>
    - <https://deepspeed.readthedocs.io/en/latest/zero3.html>
    """

    code = "DDP104"
    name = "rank-conditional-sharded-pass"
    class_slug = "sharded-step-divergence"
    severity = Severity.ERROR
    summary = ("a sharded (or buffer-broadcasting DDP) model's pass under a rank test: only some ranks "
               "join its collectives")
    triggers = ("fully_shard", "FullyShardedDataParallel", "FSDP", "deepspeed", "DistributedDataParallel",
                ".prepare(")
    project_wide = True  # the wrapper may be made by a helper of another file, the buffers defined in one

    @classmethod
    def wanted_in_project(cls, text: str) -> bool:
        """With other files known, `model = setup(model)` may bind a wrapper whatever this file names."""
        return cls.wanted(text) or "rank" in text or "main_process" in text or "_zero" in text

    def check(self, source: SourceFile) -> Iterator[Finding]:
        names = wrapped_names(source)
        if not all(w.sharded for w in names.values()) and not _program_keeps_buffers(source):
            names = {name: w for name, w in names.items() if w.sharded}  # DDP: no buffer to broadcast
        if not names:
            return
        zero3 = zero3_shown(source.text)
        # a DeepSpeed engine gathers parameters in its forward only under ZeRO-3; its backward always reduces
        sharded = {name: w for name, w in names.items()
                   if w.sharded and (zero3 or w is not Wrapper.DEEPSPEED)}

        def balanced(branch: ast.If, cls: ast.ClassDef | None) -> bool:
            mine = _passes(branch.body, names)
            return bool(mine) and mine == _passes(branch.orelse, names)

        flow = RankFlow(source, balanced)
        reported: set[int] = set()
        for guarded in flow.calls:
            guard = guarded.guard
            if guard is None or guard.trusted:
                continue
            call = guarded.call
            found = _pass_of(call, names)
            model = call.func.value if isinstance(call.func, ast.Attribute) and (
                dotted(call.func) or "") not in names else call.func  # `model.forward(x)`, or `model(x)`
            handed = None if found is not None else (
                _pass_in_callee(source, call, names) or pass_in_method(call, guarded.cls, names, _pass_of))
            if handed is not None:
                model, found = handed
            if found is None or _before_the_wrap(source, model, found[1]):
                continue
            kind, wrapper = found
            if wrapper is Wrapper.DEEPSPEED and kind != "backward" and not zero3:
                continue
            reported.add(id(guarded.call))
            how = f"; `{source.segment(call.func)}(...)` runs its forward" if handed else ""
            if not wrapper.sharded:
                what = ("DistributedDataParallel model" if wrapper is Wrapper.DDP else "model prepared by "
                        "accelerate (DistributedDataParallel on several processes)")
                yield self.finding(
                    source,
                    guarded.call,
                    f"a forward pass of a {what} (`{source.segment(model)}`) runs "
                    f"only on some ranks ({guard.where()}{how}): DDP broadcasts the module's buffers from "
                    "rank 0 before a forward (`broadcast_buffers=True`, the default, and this program's "
                    "modules have buffers), and the ranks that run it wait there for the others",
                    fix=Fix("call the wrapped module (`model.module(...)`) where only some ranks need the "
                            "result, or run the forward on every rank"),
                    facts={"pass": kind, "wrapper": wrapper.value},
                )
                continue
            yield self.finding(
                source,
                guarded.call,
                f"{_WORDS[kind]} runs only on some ranks ({guard.where()}{how}): {_WHY[kind]}, and the ranks "
                "that run it wait there for the others",
                fix=Fix("run the pass on every rank and guard only what is done with its result"),
                facts={"pass": kind},
            )
        for call in _unsynced_generates(source.tree, sharded):
            yield self.finding(
                source,
                call,
                "`generate()` on a sharded model with `synced_gpus=False`: each rank stops when its own "
                "sequences end, and a rank that stops first leaves the others waiting in the all-gather of "
                "their next forward",
                fix=Fix("drop `synced_gpus=False` (transformers syncs the ranks by itself on an FSDP or "
                        "ZeRO-3 model) or pass `synced_gpus=True`"),
                facts={"pass": "generate"},
            )
        for call, ceiling in _default_sync_generates(source, sharded):
            if id(call) in reported:
                continue
            finding = self.finding(
                source,
                call,
                f"`generate()` on an FSDP model without `synced_gpus=True`, with the transformers this "
                f"project declares ({ceiling.where}): releases up to 4.45 sync the ranks' generation loops "
                "by themselves for DeepSpeed ZeRO-3 only, so each rank stops when its own sequences end, "
                "and a rank that stops first leaves the others waiting in the all-gather of their next "
                "forward",
                fix=Fix("pass `synced_gpus=True` (or generate from a gathered copy on one rank, outside "
                        "FSDP)"),
                facts={"pass": "generate", "hedged": True},
            )
            yield dataclasses.replace(finding, severity=Severity.WARNING)
        for loop, call in _per_rank_loops(source.tree, sharded):
            finding = self.finding(
                source,
                call,
                f"a forward pass of a sharded model in a loop over this rank's share of the data "
                f"(`{source.segment(loop.iter)}`): where the shares differ in length, one rank runs a pass "
                "more and waits in its all-gather for the others",
                fix=Fix("give every rank the same number of batches: `DistributedSampler` (it pads), or pad "
                        "the share and drop the padding's result"),
                facts={"pass": "forward", "hedged": True},
            )
            yield dataclasses.replace(finding, severity=Severity.WARNING)


_WORDS = {
    "forward": "a forward pass of a sharded model",
    "generate": "`generate()` on a sharded model (a forward pass per token)",
    "backward": "a backward pass in a program that shards a model",
}
_WHY = {
    "forward": "every forward of a sharded model all-gathers its parameters",
    "generate": "every forward of a sharded model all-gathers its parameters",
    "backward": "every backward of a sharded model reduce-scatters its gradients",
}


def _program_keeps_buffers(source: SourceFile) -> bool:
    """Some module of the program (this file or one it is connected to by imports) has buffers."""
    project = source.project
    if keeps_buffers(source.text):
        return True
    return project is not None and any(m.keeps_buffers for m in project.component(source.path))


def _pass_of(call: ast.Call, names: dict[str, Wrapper]) -> tuple[str, Wrapper] | None:
    """('forward' | 'backward' | 'generate', the wrapper) where `call` is a pass of a wrapped model."""
    func = call.func
    wrapper = names.get(dotted(func) or "")
    if wrapper is not None:
        return "forward", wrapper
    if isinstance(func, ast.Attribute) and func.attr in _PASS_METHODS:
        if func.attr == "backward":  # a sharded model's, when the file shards one (DDP's: DDP102's concern)
            sharded = next((w for w in names.values() if w.sharded), None)
            return ("backward", sharded) if sharded is not None and _may_be_of(func.value, names) else None
        wrapper = names.get(dotted(func.value) or "")
        if wrapper is not None and (wrapper.sharded or func.attr == "forward"):
            return func.attr, wrapper
    return None


def _pass_in_callee(source: SourceFile, call: ast.Call, names: dict[str, Wrapper]
                    ) -> tuple[ast.expr, tuple[str, Wrapper]] | None:
    """`evaluate(model, loader)`: a project function given a wrapped model that runs its forward (the
    argument, and the pass)."""
    project = source.project
    given = [(i, a) for i, a in enumerate(call.args)] + [(k.arg, k.value) for k in call.keywords if k.arg]
    passed = [(where, arg, names[name]) for where, arg in given
              if isinstance(arg, (ast.Name, ast.Attribute)) and (name := dotted(arg)) in names]
    if project is None or not passed or not isinstance(call.func, (ast.Name, ast.Attribute)):
        return None
    found = project.resolver(source).callee(call.func, None)
    if found is None:
        return None
    target, bound = found
    for where, arg, wrapper in passed:
        if project.runs_parameter(target, where, bound):
            return arg, ("forward", wrapper)
    return None


def _before_the_wrap(source: SourceFile, model: ast.expr, wrapper: Wrapper) -> bool:
    """The model is a plain name that no wrapper binding reaches here (`fully_shard(model)` wraps in place,
    without a binding: not asked)."""
    return (wrapper is not Wrapper.FULLY_SHARD and isinstance(model, ast.Name)
            and unwrapped_here(source, model))


def _may_be_of(tensor: ast.expr, names: dict[str, Wrapper]) -> bool:
    """Whether the tensor a `.backward()` is called on may come from a wrapped model: not when it is made
    right there by calling another model (`reference(x).backward()`, `ref(x).sum().backward()`)."""
    node = tensor
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) and (
                called := dotted(node.func)):
            return called in names
        node = node.func if isinstance(node, ast.Call) else node.value
    return True  # `loss.backward()`: which model made it is not known here


def _kind(found: tuple[str, Wrapper] | None) -> str | None:
    return found[0] if found is not None else None


def _unsynced_generates(tree: ast.AST, sharded: dict[str, Wrapper]) -> Iterator[ast.Call]:
    """`model.generate(..., synced_gpus=False)` on a sharded model: the ranks' generation loops run apart."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _kind(_pass_of(node, sharded)) == "generate" and any(
                k.arg == "synced_gpus" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in node.keywords):
            yield node


# transformers syncs an FSDP model's `generate()` by itself since PR #33483 (`is_fsdp_managed_module` in
# `GenerationMixin.generate`, reviewed October 2024, after 4.45 shipped); before, only DeepSpeed ZeRO-3 was
# synced. A ceiling of 4.46 or later is not known to predate it.
_FSDP_SYNCED_SINCE = (4, 46)


def _default_sync_generates(source: SourceFile, sharded: dict[str, Wrapper]
                            ) -> Iterator[tuple[ast.Call, Ceiling]]:
    """`model.generate(...)` on an FSDP-sharded model with `synced_gpus` left to its default, in a project
    whose declared transformers predates the default that syncs FSDP models (`pins.py`)."""
    fsdp: dict[str, Wrapper] = {
        name: w for name, w in sharded.items() if w in (Wrapper.FSDP, Wrapper.FULLY_SHARD)}
    if not fsdp or "generate" not in source.text:
        return
    ceiling: Ceiling | None = None
    for node in ast.walk(source.tree):
        if not (isinstance(node, ast.Call) and _kind(_pass_of(node, fsdp)) == "generate") or any(
                k.arg in ("synced_gpus", None) for k in node.keywords):
            continue
        ceiling = ceiling or declared_ceiling(source.path, "transformers")
        if ceiling is None or not ceiling.before(_FSDP_SYNCED_SINCE):
            return
        yield node, ceiling


def _passes(body: list[ast.stmt], sharded: dict[str, Wrapper]) -> list[str]:
    out: list[str] = []
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Call):
            kind = _kind(_pass_of(node, sharded))
            if kind is not None:
                out.append(kind)
        stack.extend(reversed([c for c in child_nodes(node) if not isinstance(c, _SCOPES)]))
    return out


def _per_rank_loops(tree: ast.AST, sharded: dict[str, Wrapper]) -> Iterator[tuple[ast.For, ast.Call]]:
    """`for` loops over a rank's slice of the data (or a name bound to one in the same scope) whose body
    runs a forward of a sharded model: the loop and that forward."""
    for scope in ast.walk(tree):
        if not isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        shares = {
            target.id
            for node in _in_scope(scope)
            if isinstance(node, ast.Assign) and _is_rank_share(node.value)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in _in_scope(scope):
            if not isinstance(node, ast.For):
                continue
            it = node.iter
            if not (_is_rank_share(it) or (isinstance(it, ast.Name) and it.id in shares)):
                continue
            for inner in (n for stmt in node.body for n in ast.walk(stmt)):
                if isinstance(inner, ast.Call) and _kind(_pass_of(inner, sharded)) in ("forward", "generate"):
                    yield node, inner
                    break


def _in_scope(scope: ast.AST) -> Iterator[ast.AST]:
    stack = [c for c in child_nodes(scope) if not isinstance(c, _SCOPES)]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in child_nodes(node) if not isinstance(c, _SCOPES))


def _is_rank_share(node: ast.expr) -> bool:
    """`data[rank::world]`, `chunks[rank]`, `np.array_split(data, world)[dist.get_rank()]`: a subscript
    whose index mentions a rank."""
    if not isinstance(node, ast.Subscript):
        return False
    for part in ast.walk(node.slice):
        if isinstance(part, ast.Name) and _role_of_name(part.id, attribute=False) is not None:
            return True
        if isinstance(part, ast.Attribute) and _role_of_name(part.attr, attribute=True) is not None:
            return True
        if isinstance(part, ast.Call) and isinstance(part.func, (ast.Attribute, ast.Name)):
            name = part.func.attr if isinstance(part.func, ast.Attribute) else part.func.id
            if _role_of_method(name) is not None:
                return True
    return False
