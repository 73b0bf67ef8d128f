"""Process groups a file makes with constant members (`g = dist.new_group(ranks=[0, 1])`), and whether
a guarded collective on one of them reaches every member (DDP101): `if rank in (0, 1): all_reduce(t,
group=g01)` is made by the whole group, and torch skips it on the other ranks."""

from __future__ import annotations

import ast
from functools import cached_property

from .guards import GuardedCall
from .rank_sources import GROUP_KEYWORDS
from .source import SourceFile, dotted, statements


class ConstantGroups:
    """The groups of one file with constant members, read once."""

    def __init__(self, source: SourceFile):
        self.source = source

    @cached_property
    def groups(self) -> dict[str, frozenset[int]]:
        """Process groups created with constant members: `g = dist.new_group(ranks=[0, 1])` -> {0, 1}."""
        found: dict[str, frozenset[int]] = {}
        conflicting: set[str] = set()
        for node in statements(self.source.tree.body):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                continue
            func = node.value.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) != "new_group":
                continue
            arg = node.value.args[0] if node.value.args else next(
                (kw.value for kw in node.value.keywords if kw.arg == "ranks"), None)
            members = _constant_ranks(arg) if arg is not None else None
            for target in node.targets:
                name = dotted(target)
                if name is None:
                    continue
                if members is None or found.get(name, members) != members:
                    conflicting.add(name)
                found[name] = members or frozenset()
        return {name: members for name, members in found.items() if name not in conflicting}

    def reaches_whole_group(self, guarded: GuardedCall) -> bool:
        """The call is a collective on a group whose every member passes the guard (`if rank in (0, 1):
        all_reduce(t, group=g01)`): the group's ranks all make it; torch skips it on the others."""
        if guarded.guard is None:
            return True
        ranks = guarded.guard.ranks
        func = guarded.call.func
        if (
            func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        ) == "init_process_group":
            # `if rank <= 1: init_process_group(..., world_size=2)`: a job of exactly the branch's ranks.
            size = next((kw.value for kw in guarded.call.keywords if kw.arg == "world_size"), None)
            return (
                isinstance(size, ast.Constant)
                and ranks.members is not None
                and size.value == len(ranks.members)
            )
        for kw in guarded.call.keywords:
            if kw.arg in GROUP_KEYWORDS:
                name = dotted(kw.value)
                members = self.groups.get(name) if name else None
                return members is not None and guarded.guard.ranks.covers(members)
        return False


def _constant_ranks(node: ast.expr) -> frozenset[int] | None:
    """`[0, 1]`, `(0, 1)`, `range(4)`, `list(range(0, 4))` as a set of ranks."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("list", "tuple", "set")
        and len(node.args) == 1
    ):
        return _constant_ranks(node.args[0])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
        bounds = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, int)]
        if len(bounds) == len(node.args) and 1 <= len(bounds) <= 3:
            return frozenset(range(*bounds))
        return None
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, int)]
        return frozenset(values) if len(values) == len(node.elts) else None
    return None


