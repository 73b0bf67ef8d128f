"""Rank predicates judged by the values their parts may take, not by their shape alone.

`rank % d == 0` selects one rank per block of `d`: one per node when `d` is the processes per node. When
`d` may be 1, it holds on every rank: `world_size / per_node` with `per_node` read from a setting whose
default is the world size itself (`int(os.environ.get("PROCS_PER_NODE", world_size))`), so a run that
does not set it divides the world by itself.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence

from .rank_sources import WORLD_SIZES, _world_size_name

Bindings = Mapping[str, Sequence[ast.expr | None]]


def may_be_one(divisor: ast.expr, bindings: Bindings) -> bool:
    """`divisor` is `world / x` (or `//`) where `x` may equal the world size."""
    return isinstance(divisor, ast.BinOp) and isinstance(divisor.op, (ast.Div, ast.FloorDiv)) and (
        _world_sized(divisor.left, bindings, 2)) and _world_sized(divisor.right, bindings, 2)


def _world_sized(node: ast.expr | None, bindings: Bindings, depth: int) -> bool:
    """A value that may be the world size: a world size, a setting whose default is one, or a name one of
    whose bindings is (a few names deep)."""
    if node is None:
        return False
    if _world_size_name(node) in WORLD_SIZES:
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
            "int", "float") and len(node.args) == 1:
        return _world_sized(node.args[0], bindings, depth)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
            "get", "getenv") and len(node.args) == 2:  # `os.environ.get("PER_NODE", world_size)`
        return _world_sized(node.args[1], bindings, depth)
    if isinstance(node, ast.Name) and depth:
        return any(_world_sized(value, bindings, depth - 1) for value in bindings.get(node.id, ()))
    return False
