"""Whether a loader only feeds evaluation (DDP502): every loop over it is in a function that puts a model in
eval mode or runs under `torch.no_grad()`/`inference_mode()`, and trains nothing (no `.backward()`, no
optimizer `.step()`). Every rank then scores the whole set in some order: redundant work, the same result,
nothing trained on overlapping shards."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .source import SourceFile, last_name

NO_GRAD = ("no_grad", "inference_mode")
TRAINS = ("backward", "step")
# What else a file may do with an evaluation loader's name: its size and its dataset's size.
HARMLESS = ("dataset", "batch_size", "sampler")


def _looped_name(node: ast.AST) -> str | None:
    """`x` of `for ... in x`, `enumerate(x)`, `tqdm(x)`, a comprehension's: walks of the loader."""
    if not isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return None
    it = node.iter
    while isinstance(it, ast.Call) and it.args:
        it = it.args[0]
    return it.id if isinstance(it, ast.Name) else None


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
    uses = _uses(source)
    bound = uses.assigned.get(id(call), [])
    if len(bound) != 1 or len(bound[0].targets) != 1 or not isinstance(bound[0].targets[0], ast.Name):
        return False
    name = bound[0].targets[0].id
    loops = uses.loops.get(name, [])
    walked = uses.harmless | {id(n) for loop, _ in loops for n in ast.walk(loop.iter)}  # type: ignore[attr-defined]
    if not loops or any(id(use) not in walked for use in uses.loads.get(name, [])):
        return False
    return all(_evaluates(function, loop) for loop, function in loops)


@dataclass(frozen=True)
class _Uses:
    """What `evaluation_only` asks of a file, for any loader name: made in one walk of the file and one
    of each function, not in four walks per loader call."""

    assigned: dict[int, list[ast.Assign]]  # id(value) -> the assignments of that value
    loops: dict[str, list[tuple[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef]]]  # name -> its loops
    harmless: frozenset[int]  # ids of the names read only for their size or dataset (`len(x)`, `x.dataset`)
    loads: dict[str, list[ast.Name]]  # name -> where it is read


def _uses(source: SourceFile) -> _Uses:
    found: _Uses | None = getattr(source, "_evaluation_uses", None)
    if found is not None:
        return found
    assigned: dict[int, list[ast.Assign]] = {}
    loops: dict[str, list[tuple[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef]]] = {}
    harmless: set[int] = set()
    loads: dict[str, list[ast.Name]] = {}
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Assign):
            assigned.setdefault(id(node.value), []).append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # a nested function's loops count for it and for each function around it
            for inner in ast.walk(node):
                looped = _looped_name(inner)
                if looped is not None:
                    loops.setdefault(looped, []).append((inner, node))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in HARMLESS:
            harmless.add(id(node.value))
        elif isinstance(node, ast.Call) and last_name(node.func) == "len" and node.args:
            harmless.add(id(node.args[0]))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            loads.setdefault(node.id, []).append(node)
    found = _Uses(assigned, loops, frozenset(harmless), loads)
    source._evaluation_uses = found  # type: ignore[attr-defined]
    return found
