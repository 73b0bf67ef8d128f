"""Recognising rank conditions: expressions whose truth differs between the ranks of a job.

`polarity(test)` answers, for an `if` test, whether its body and its else-branch each run on only some of
the ranks: `(body_is_rank_restricted, else_is_rank_restricted)`. `if rank == 0` restricts both sides;
`if rank == 0 and verbose` restricts only the body; `if not dist.is_initialized() or rank == 0` restricts
only the else-branch (single-process runs take the body). Being wrong here means a false positive, so
anything not clearly rank-dependent is not a rank condition.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from .source import SourceFile

# Names and attributes that hold a process's rank. `x.rank` covers `self.rank`, `trainer.global_rank`,
# `rank_zero_only.rank`; `pg.rank()` is ProcessGroup.rank().
RANK_NAMES = frozenset({"rank", "global_rank", "local_rank", "node_rank", "my_rank", "process_index",
                        "local_process_index", "world_rank"})
RANK_ATTRS = RANK_NAMES
RANK_METHODS = frozenset({"get_rank", "get_local_rank", "get_global_rank", "get_node_local_rank", "rank"})
RANK_ENV = frozenset({"RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "SLURM_LOCALID",
                      "OMPI_COMM_WORLD_RANK", "PMI_RANK"})
# Booleans that are true on one rank only (Lightning, Fabric, accelerate, common spellings).
RANK_FLAGS = frozenset({"is_global_zero", "is_main_process", "is_local_main_process", "is_local_zero",
                        "is_last_process", "is_rank_zero", "is_master", "is_main_rank"})

# Functions that answer "am I the main process?" (detectron2's comm.is_main_process(), timm's is_primary()).
RANK_PREDICATES = frozenset({"is_primary", "is_main", "is_rank_0", "is_rank0", "is_global_main_process"})

Polarity = tuple[bool, bool]
NOT_RANK: Polarity = (False, False)


class RankNames:
    """The rank-holding local variables of one scope (`r = dist.get_rank()`, `main = r == 0`).

    Flow-insensitive but conservative: a name assigned anything else anywhere in the scope is dropped.
    """

    def __init__(self, body: Iterable[ast.stmt], parent: RankNames | None = None):
        self.values: set[str] = set(parent.values) if parent else set()
        self.flags: dict[str, Polarity] = dict(parent.flags) if parent else {}
        # Rank-sounding names bound to something else here (`for rank in range(world_size)`).
        self.shadowed: set[str] = set(parent.shadowed) if parent else set()
        assigned: dict[str, list[ast.expr | None]] = {}
        for node in _scope_nodes(body):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    for name in _target_names(target):
                        value = node.value if isinstance(target, ast.Name) else None
                        assigned.setdefault(name, []).append(value)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                target = node.target
                value = node.value if isinstance(node, (ast.AnnAssign, ast.NamedExpr)) else None
                for name in _target_names(target):
                    assigned.setdefault(name, []).append(value if isinstance(target, ast.Name) else None)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
                targets = [node.target] if isinstance(node, (ast.For, ast.AsyncFor)) else [
                    item.optional_vars for item in node.items if item.optional_vars is not None]
                for target in targets:
                    for name in _target_names(target):
                        assigned.setdefault(name, []).append(None)
        # Twice, so that `main = r == 0` is understood whichever of it and `r = get_rank()` comes first.
        for name, values in [*assigned.items(), *assigned.items()]:
            self.values.discard(name)
            self.flags.pop(name, None)
            self.shadowed.add(name)
            if None in values:
                continue
            if all(self.is_rank_value(v) for v in values if v is not None):
                self.values.add(name)
                self.shadowed.discard(name)
                continue
            polarities = {self.polarity(v) for v in values if v is not None}
            if len(polarities) == 1 and (pol := polarities.pop()) != NOT_RANK:
                self.flags[name] = pol

    def is_rank_value(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.values or node.id in RANK_NAMES and node.id not in self.shadowed
        if isinstance(node, ast.Attribute):
            return node.attr in RANK_ATTRS
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                if func.id in ("int",) and len(node.args) == 1:
                    return self.is_rank_value(node.args[0])
                return func.id in RANK_METHODS
            if isinstance(func, ast.Attribute):
                if func.attr in RANK_METHODS:
                    return True
                if func.attr in ("get", "getenv") and node.args:  # os.environ.get("RANK"), os.getenv("RANK")
                    return _is_rank_env_key(node.args[0])
            return False
        if isinstance(node, ast.Subscript):  # os.environ["RANK"]
            return isinstance(node.value, ast.Attribute) and node.value.attr == "environ" and _is_rank_env_key(
                node.slice)
        return False

    def polarity(self, test: ast.expr) -> Polarity:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            body, other = self.polarity(test.operand)
            return other, body
        if isinstance(test, ast.BoolOp):
            parts = [self.polarity(v) for v in test.values]
            if isinstance(test.op, ast.And):
                return any(p[0] for p in parts), all(p[1] for p in parts)
            return all(p[0] for p in parts), any(p[1] for p in parts)
        if isinstance(test, ast.Compare):
            return (True, True) if self._is_rank_compare(test) else NOT_RANK
        if isinstance(test, ast.Name):
            if test.id in self.flags:
                return self.flags[test.id]
            return (True, True) if test.id in RANK_FLAGS and test.id not in self.shadowed else NOT_RANK
        if isinstance(test, ast.Attribute):
            return (True, True) if test.attr in RANK_FLAGS else NOT_RANK
        if isinstance(test, ast.NamedExpr):
            return self.polarity(test.value)
        if isinstance(test, ast.Call) and not test.args and not test.keywords or isinstance(test, ast.Call) and (
                len(test.args) == 1 and self.is_rank_value(test.args[0])):
            # `comm.is_main_process()`, `is_rank_zero()`, `is_main_process(local_rank)`
            func = test.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            return (True, True) if name in RANK_FLAGS or name in RANK_PREDICATES else NOT_RANK
        return NOT_RANK

    def _is_rank_compare(self, test: ast.Compare) -> bool:
        operands = [test.left, *test.comparators]
        if any(isinstance(op, (ast.Is, ast.IsNot)) for op in test.ops):
            return False  # `rank is None` tells configured from unconfigured, not one rank from another
        if any(isinstance(op, (ast.In, ast.NotIn)) for op in test.ops):
            # `rank in (0, 1)` is a rank test; `rank in group_ranks` is group membership, which code
            # uses to skip collectives of a group the rank is not in: correct, so not a rank condition.
            return len(operands) == 2 and self.is_rank_value(test.left) and _constant_collection(operands[1])
        ranked = [self.is_rank_value(op) for op in operands]
        if any(_not_a_process_rank(op) for op, is_rank in zip(operands, ranked, strict=False) if not is_rank):
            return False
        return any(ranked) and not all(ranked)


def _not_a_process_rank(node: ast.expr) -> bool:
    """`rank != -1` tells a configured process from an unconfigured one, not one rank from another; so does
    torch's test harness `self.rank != self.MAIN_PROCESS_RANK` (the launcher process, rank -1)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return isinstance(node.operand, ast.Constant)
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name == "MAIN_PROCESS_RANK"


def _constant_collection(node: ast.expr) -> bool:
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and all(
        isinstance(e, ast.Constant) or isinstance(e, ast.UnaryOp) and isinstance(e.operand, ast.Constant)
        for e in node.elts)


def _is_rank_env_key(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value in RANK_ENV


def _target_names(target: ast.expr) -> Iterable[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _target_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def _scope_nodes(body: Iterable[ast.stmt]) -> Iterable[ast.AST]:
    """The statements of a scope, not descending into nested functions or classes (binding happens in
    statements; a walrus in an expression is rare enough to ignore)."""
    stack: list[ast.stmt] = list(body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if block:
                stack.extend(block)
        for handler in getattr(node, "handlers", ()):
            stack.extend(handler.body)
        for case in getattr(node, "cases", ()):
            stack.extend(case.body)


def scope_names(source: SourceFile) -> RankNames:
    return RankNames(source.tree.body)
