"""Whether a loader only feeds evaluation (DDP502): every loop over it is in a function that puts a model in
eval mode or runs under `torch.no_grad()`/`inference_mode()`, and trains nothing (no `.backward()`, no
optimizer `.step()`). Every rank then scores the whole set in some order: redundant work, the same result,
nothing trained on overlapping shards."""

from __future__ import annotations

import ast

from .source import SourceFile, last_name

NO_GRAD = ("no_grad", "inference_mode")
TRAINS = ("backward", "step")
# What else a file may do with an evaluation loader's name: its size and its dataset's size.
HARMLESS = ("dataset", "batch_size", "sampler")


def _loop_over(node: ast.AST, name: str) -> bool:
    """`for ... in name`, `enumerate(name)`, `tqdm(name)`, a comprehension's: walks of the loader."""
    if not isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return False
    it = node.iter
    while isinstance(it, ast.Call) and it.args:
        it = it.args[0]
    return isinstance(it, ast.Name) and it.id == name


def _no_grad(node: ast.expr) -> bool:
    return last_name(node.func if isinstance(node, ast.Call) else node) in NO_GRAD


def _evaluates(function: ast.FunctionDef | ast.AsyncFunctionDef, loop: ast.AST) -> bool:
    calls = [n for n in ast.walk(function) if isinstance(n, ast.Call)]
    if any(last_name(call.func) in TRAINS for call in calls):
        return False
    if any(_no_grad(deco) for deco in function.decorator_list):
        return True
    if any(last_name(call.func) == "eval" and not call.args for call in calls):
        return True
    return any(isinstance(n, ast.With) and any(_no_grad(item.context_expr) for item in n.items)
               and any(inner is loop for inner in ast.walk(n)) for n in ast.walk(function))


def evaluation_only(source: SourceFile, call: ast.Call) -> bool:
    """The loader `call` makes is bound to a name that the file only walks in evaluation loops."""
    bound = [node for node in ast.walk(source.tree) if isinstance(node, ast.Assign) and node.value is call]
    if len(bound) != 1 or len(bound[0].targets) != 1 or not isinstance(bound[0].targets[0], ast.Name):
        return False
    name = bound[0].targets[0].id
    loops: list[tuple[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    walked: set[int] = set()
    for function in ast.walk(source.tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if _loop_over(node, name):
                    loops.append((node, function))
                    walked.update(id(n) for n in ast.walk(node.iter))  # type: ignore[attr-defined]
    for node in ast.walk(source.tree):  # any other use (passed on, returned, walked at module level)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in HARMLESS:
            walked.add(id(node.value))
        elif isinstance(node, ast.Call) and last_name(node.func) == "len" and node.args:
            walked.add(id(node.args[0]))
    uses = [n for n in ast.walk(source.tree) if isinstance(n, ast.Name) and n.id == name
            and isinstance(n.ctx, ast.Load)]
    if not loops or any(id(use) not in walked for use in uses):
        return False
    return all(_evaluates(function, loop) for loop, function in loops)
