from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..registry import Rule, register
from ..source import SourceFile, call_name, functions

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@register
class NoSyncEveryMicroBatch(Rule):
    """
    ## What it does
    Finds gradient accumulation whose `no_sync()` wraps every micro-batch: a loop whose body always enters
    `with model.no_sync():` (or accelerate's `accelerator.no_sync(model)`) around a `backward`, in a
    function where no `backward` ever runs outside `no_sync()`.

    ## Why is this bad?
    Inside `no_sync()` DDP does not all-reduce gradients; the sync is meant to happen on the last
    micro-batch of each step, outside the context. When every backward is inside it, gradients are never
    averaged: each rank steps on its own data and the replicas drift apart. Nothing fails; the ranks train
    different models, and the checkpoint rank 0 saves holds rank 0's.

    ## Example
    ```python
    for micro in range(accumulate):
        with model.no_sync():
            loss_fn(model(x[micro]), y[micro]).backward()
    optimizer.step()
    ```

    ## Use instead
    ```python
    for micro in range(accumulate):
        last = micro == accumulate - 1
        with contextlib.nullcontext() if last else model.no_sync():
            loss_fn(model(x[micro]), y[micro]).backward()
    optimizer.step()
    ```

    ## Known problems
    A backward inside a helper the loop calls is not seen, and neither is a sync done by hand
    (`all_reduce` of every gradient after the loop), which makes the pattern correct.

    ## Fix safety
    No automatic fix: which micro-batch is the last depends on the loop.

    ## References
    - <https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html#torch.nn.parallel.DistributedDataParallel.no_sync>
    - <https://huggingface.co/docs/accelerate/concept_guides/gradient_synchronization>
    """

    code = "DDP701"
    name = "no-sync-every-micro-batch"
    class_slug = "replica-divergence"
    severity = Severity.WARNING
    summary = "gradient accumulation with no_sync() around every micro-batch: gradients never sync"
    triggers = ("no_sync",)

    def check(self, source: SourceFile) -> Iterator[Finding]:
        scopes: list[ast.AST] = [source.tree, *functions(source.tree)]
        for scope in scopes:
            withs = list(_unconditional_no_sync_in_loops(scope))
            if not withs or _backward_outside_no_sync(scope):
                continue
            for node in withs:
                yield self.finding(
                    source, node,
                    "`no_sync()` wraps every micro-batch of this loop and no backward runs outside it: DDP "
                    "never all-reduces a gradient, and the replicas drift apart",
                    fix=Fix("run the last micro-batch of each step outside `no_sync()` "
                            "(`nullcontext() if last else model.no_sync()`)"),
                )


def _is_no_sync(item: ast.withitem) -> bool:
    expr = item.context_expr
    return isinstance(expr, ast.Call) and call_name(expr).rsplit(".", 1)[-1] == "no_sync"


def _has_backward(nodes: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Call) and call_name(n).rsplit(".", 1)[-1] == "backward"
               for stmt in nodes for n in _walk_scope(stmt))


def _walk_scope(node: ast.AST) -> Iterator[ast.AST]:
    """`ast.walk` that does not enter nested functions, classes or lambdas."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(child for child in ast.iter_child_nodes(current) if not isinstance(child, _SCOPES))


def _unconditional_no_sync_in_loops(scope: ast.AST) -> Iterator[ast.With]:
    """`with ...no_sync():` statements around a backward that a loop body of `scope` always enters (not
    under an `if`, a `match` or a nested function)."""
    body = scope.body if isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)) else []
    yield from _in_statements(body, in_loop=False)


def _in_statements(body: list[ast.stmt], in_loop: bool) -> Iterator[ast.With]:
    for stmt in body:
        if isinstance(stmt, _LOOPS):
            yield from _in_statements(stmt.body, in_loop=True)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            if in_loop and isinstance(stmt, ast.With) and any(map(_is_no_sync, stmt.items)) \
                    and _has_backward(stmt.body):
                yield stmt
            else:
                yield from _in_statements(stmt.body, in_loop)
        elif isinstance(stmt, ast.Try):
            yield from _in_statements(stmt.body, in_loop)


def _backward_outside_no_sync(scope: ast.AST) -> bool:
    """Whether `scope` calls a backward anywhere that is not inside a `with ...no_sync():`."""
    def visit(node: ast.AST) -> bool:
        if isinstance(node, ast.With) and any(map(_is_no_sync, node.items)):
            return False
        if isinstance(node, ast.Call) and call_name(node).rsplit(".", 1)[-1] == "backward":
            return True
        return any(visit(child) for child in ast.iter_child_nodes(node) if not isinstance(child, _SCOPES))

    body = scope.body if isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)) else []
    return any(visit(stmt) for stmt in body)
