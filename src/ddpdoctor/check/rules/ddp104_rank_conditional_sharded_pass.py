from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..guards import RankFlow
from ..rank_sources import _role_of_method, _role_of_name
from ..registry import Rule, register
from ..source import SourceFile, dotted, statements

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
    between ranks whenever the data does not divide evenly.

    ## Why is this bad?
    A sharded model keeps each parameter split across the ranks. Every forward all-gathers the parameters
    before each wrapped module runs, and every backward reduce-scatters the gradients (and all-gathers again
    what the forward resharded): each pass is a series of collectives every rank must join. Run on rank 0
    alone, rank 0 waits in the first all-gather forever while the others have gone on, and the stack names
    FSDP's or DeepSpeed's internals, not this line.

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
    The sharded model is known by its name in this file (`model = fully_shard(...)`, `fully_shard(model)`,
    `engine, *_ = deepspeed.initialize(...)`, an attribute such as `self.model`): a model sharded in another
    file, or passed in as an argument, is not seen. A `.backward()` is counted as the sharded model's when
    the file shards a model at all. DeepSpeed shards parameters only under ZeRO stage 3; a forward under a
    rank test is harmless with stages 1 and 2 (a backward is not: it all-reduces gradients). Ranks that run a
    different number of passes in a loop of per-rank length, and `generate()` stopping at different lengths,
    are not found here (the guard counts passes at run time). `generate()` is reported outside a rank test
    only with an explicit `synced_gpus=False`: left to its default, transformers turns the sync on by itself
    for a model under DeepSpeed ZeRO-3 or FSDP when the world has more than one rank
    (`GenerationMixin.generate`: `synced_gpus = (is_deepspeed_zero3_enabled() or
    is_fsdp_managed_module(self)) and world_size > 1`; older releases did so for ZeRO-3 only, and an FSDP
    model there needs `synced_gpus=True`, which is not checked).

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
    summary = "a sharded model's forward or backward under a rank test: only some ranks join its collectives"
    triggers = ("fully_shard", "FullyShardedDataParallel", "FSDP", "deepspeed")

    def check(self, source: SourceFile) -> Iterator[Finding]:
        sharded = _sharded_names(source)
        if not sharded:
            return

        def balanced(branch: ast.If, cls: ast.ClassDef | None) -> bool:
            mine = _passes(branch.body, sharded)
            return bool(mine) and mine == _passes(branch.orelse, sharded)

        flow = RankFlow(source, balanced)
        for guarded in flow.calls:
            guard = guarded.guard
            if guard is None or guard.trusted:
                continue
            kind = _pass_of(guarded.call, sharded)
            if kind is None:
                continue
            yield self.finding(
                source,
                guarded.call,
                f"{_WORDS[kind]} runs only on some ranks ({guard.where()}): {_WHY[kind]}, and the ranks "
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


def _sharded_names(source: SourceFile) -> set[str]:
    """The names (`model`, `self.model`) this file binds to a sharded model."""
    names: set[str] = set()
    for node in statements(source.tree.body):  # assignments and expression statements: no expression walked
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            wrapper = _wrapper(source, node.value)
            if wrapper is None:
                continue
            for target in node.targets:
                if wrapper == "deepspeed" and isinstance(target, ast.Tuple) and target.elts:
                    target = target.elts[0]  # engine, optimizer, loader, scheduler = deepspeed.initialize(..)
                name = dotted(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
                if name:
                    names.add(name)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and node.value.args:
            if _wrapper(source, node.value) == "fully_shard":  # in place: the module is now sharded
                name = dotted(node.value.args[0])
                if name:
                    names.add(name)
    return names


def _wrapper(source: SourceFile, call: ast.Call) -> str | None:
    resolved = source.resolve(call.func) or ""
    last = resolved.rsplit(".", 1)[-1]
    if last == "fully_shard" and "fsdp" in resolved:
        return "fully_shard"
    if last == "FullyShardedDataParallel":
        return "FullyShardedDataParallel"
    if resolved == "deepspeed.initialize":
        return "deepspeed"
    return None


def _pass_of(call: ast.Call, sharded: set[str]) -> str | None:
    """'forward', 'backward' or 'generate' where `call` is a pass of a sharded model."""
    func = call.func
    if dotted(func) in sharded:
        return "forward"
    if isinstance(func, ast.Attribute) and func.attr in _PASS_METHODS:
        if func.attr == "backward":
            return "backward"
        if dotted(func.value) in sharded:
            return func.attr
    return None


def _unsynced_generates(tree: ast.AST, sharded: set[str]) -> Iterator[ast.Call]:
    """`model.generate(..., synced_gpus=False)` on a sharded model: the ranks' generation loops run apart."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _pass_of(node, sharded) == "generate" and any(
                k.arg == "synced_gpus" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in node.keywords):
            yield node


def _passes(body: list[ast.stmt], sharded: set[str]) -> list[str]:
    out: list[str] = []
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Call):
            kind = _pass_of(node, sharded)
            if kind is not None:
                out.append(kind)
        stack.extend(reversed([c for c in ast.iter_child_nodes(node) if not isinstance(c, _SCOPES)]))
    return out


def _per_rank_loops(tree: ast.AST, sharded: set[str]) -> Iterator[tuple[ast.For, ast.Call]]:
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
                if isinstance(inner, ast.Call) and _pass_of(inner, sharded) in ("forward", "generate"):
                    yield node, inner
                    break


def _in_scope(scope: ast.AST) -> Iterator[ast.AST]:
    stack = [c for c in ast.iter_child_nodes(scope) if not isinstance(c, _SCOPES)]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, _SCOPES))


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
