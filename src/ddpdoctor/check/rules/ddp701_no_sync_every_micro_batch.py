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
    function where no `backward` ever runs outside `no_sync()`. Also the sync on the first micro-batch
    instead of the last: a loop whose choice between `no_sync()` and a plain backward tests its index
    against 0 (`nullcontext() if i == 0 else model.no_sync()`).

    ## Why is this bad?
    Inside `no_sync()` DDP does not all-reduce gradients; the sync is meant to happen on the last
    micro-batch of each step, outside the context, when the gradient holds every micro-batch. When every
    backward is inside it, gradients are never averaged: each rank steps on its own data and the replicas
    drift apart. Synced on the first micro-batch, only that one is averaged; the later ones add each
    rank's own gradient to it. Nothing fails; the ranks train
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
    (`all_reduce` of every gradient after the loop), which makes the pattern correct. The first-micro-batch
    form is recognised as a comparison of the loop's own index with 0, or as a choice by the index modulo
    a window (`ctx = model.no_sync if i % n != 0 else nullcontext`: the first of each window syncs) in a
    loop that does not step the optimizer on that same micro-batch (`if i % n == 0: optimizer.step()` makes
    it the last of its window); where the step is taken in a helper, the sync test alone decides.

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
        for test in _first_micro_batch_syncs(source.tree):
            yield self.finding(
                source, test,
                f"the sync step is chosen by `{source.segment(test)}`: the first micro-batch"
                f"{' of each window' if _is_window_test(test) else ''} all-reduces, and the later ones add "
                "each rank's own gradient to the averaged one",
                fix=Fix("sync on the last micro-batch: `nullcontext() if i == accumulate - 1 else "
                        "model.no_sync()`"),
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
    return any(visit(stmt) for stmt in body if not isinstance(stmt, _SCOPES))


def _first_micro_batch_syncs(tree: ast.AST) -> Iterator[ast.expr]:
    """Loops with an index (`for i, ... in enumerate(...)`, `for i in range(...)`) whose body chooses
    between `no_sync()` and a plain backward by `i == 0` / `not i` (an `if` around the two, or a conditional
    context expression)."""
    for loop in ast.walk(tree):
        if not isinstance(loop, (ast.For, ast.AsyncFor)):
            continue
        index = _loop_index(loop)
        if index is None:
            continue
        for node in (n for stmt in loop.body for n in _walk_scope(stmt)):
            if isinstance(node, ast.IfExp) and _is_first(node.test, index) and (
                _calls_no_sync(node.body) or _calls_no_sync(node.orelse)
            ):
                yield node.test
            elif isinstance(node, ast.IfExp) and (
                    _names_no_sync(node.body) != _names_no_sync(node.orelse)) and (
                    (first := _window_first(node.test, index)) is not None
                    and first != _names_no_sync(node.body) and not _steps_on_window_first(loop, index)):
                # `ctx = model.no_sync if i % n != 0 else nullcontext`: the plain backward is the first of
                # each window of n, while the loop steps the optimizer after the last one (or elsewhere)
                yield node.test
            elif isinstance(node, ast.If) and _is_first(node.test, index) and _has_backward(node.body) \
                    and _has_backward(node.orelse) and (_has_no_sync(node.body) != _has_no_sync(node.orelse)):
                yield node.test


def _loop_index(loop: ast.For | ast.AsyncFor) -> str | None:
    target, it = loop.target, loop.iter
    if isinstance(target, ast.Name) and isinstance(it, ast.Call) and call_name(it) == "range":
        return target.id
    if isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name) \
            and isinstance(it, ast.Call) and call_name(it) == "enumerate":
        return target.elts[0].id
    return None


def _is_first(test: ast.expr, index: str) -> bool:
    """`i == 0`, `0 == i`, `not i`."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return isinstance(test.operand, ast.Name) and test.operand.id == index
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        sides = (test.left, test.comparators[0])
        names = [s for s in sides if isinstance(s, ast.Name) and s.id == index]
        zeros = [s for s in sides if isinstance(s, ast.Constant) and s.value == 0]
        return bool(names and zeros)
    return False


def _is_window_test(test: ast.expr) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(test))


def _window_first(test: ast.expr, index: str) -> bool | None:
    """For a test of the loop index modulo a window (`i % n == 0`, `not i % n`, `i % n != 0`, `i % n`):
    whether it holds on the first micro-batch of each window (True) or on the others (False); None for any
    other test."""
    negated = False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negated = test.operand, True
    if _index_modulo(test, index):
        return negated  # `i % n` is true off the window's first
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.NotEq)) \
            and _index_modulo(test.left, index) and isinstance(test.comparators[0], ast.Constant) \
            and test.comparators[0].value == 0:
        return isinstance(test.ops[0], ast.Eq) != negated
    return None


def _index_modulo(node: ast.expr, index: str) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Name) \
        and node.left.id == index


def _steps_on_window_first(loop: ast.For | ast.AsyncFor, index: str) -> bool:
    """The loop steps the optimizer under a test that holds on each window's first micro-batch too (the
    synced backward is then the last of the window that step closes)."""
    return any(isinstance(node, ast.If) and _window_first(node.test, index) is True and any(
        isinstance(n, ast.Call) and call_name(n).rsplit(".", 1)[-1] == "step"
        for stmt in node.body for n in ast.walk(stmt)) for stmt in loop.body for node in _walk_scope(stmt))


def _names_no_sync(node: ast.expr) -> bool:
    """`model.no_sync()` or the method itself (`model.no_sync`, entered later as `with ctx():`)."""
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute) and target.attr == "no_sync"


def _calls_no_sync(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and call_name(node).rsplit(".", 1)[-1] == "no_sync"


def _has_no_sync(body: list[ast.stmt]) -> bool:
    return any(
        isinstance(n, ast.With) and any(map(_is_no_sync, n.items)) for stmt in body for n in _walk_scope(stmt)
    )
