"""Rank reasoning: which processes of a job take each branch of an `if`.

`RankNames(body).test(expr)` reads an `if` test and answers with a `RankTest`: the `RankSet` of processes
that take the body and the one that takes the else-branch. The sets are the elements of a small lattice
(`Ranks`): no process of a distributed run (`not dist.is_initialized()`, `world_size == 1`), global rank 0
(`rank == 0`, `is_global_zero`, `is_main_process`, `is_world_process_zero()`), one given rank, one process
per node (`local_rank == 0`, `is_local_main_process`, `rank % ngpus_per_node == 0`, `gpu == 0`), every
process of one node (`node_rank == 0`, `args.nr == 0`: a node rank, not a process rank), some ranks, and
every rank. `and`, `or` and `not` combine them (meet, join, swap). A test that is not about ranks is taken
by every rank alike (`ALL` on both sides).

DDP101 asks whether a set is `restricted` (some ranks, not all); DDP601 whether it has at most one writer
per file system (`one_writer_per_node`). Being wrong here means a false positive, so anything not clearly
rank-dependent is not a rank condition.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from typing import Protocol

from .rank_choices import choice_role, choice_test
from .rank_ranges import may_be_one
from .rank_sets import (  # noqa: F401
    ALL,
    DISTRIBUTED,
    NONE,
    SOME,
    UNIFORM,
    Polarity,
    Ranks,
    RankSet,
    RankTest,
    Role,
    join,
    meet,
)
from .rank_sources import (  # noqa: F401
    _MIRROR,
    DISTRIBUTED_CALLS,
    LAUNCHER_VARIABLES,
    _constants,
    _distributed_flag,
    _env_role,
    _environment,
    _flag_test,
    _int_constant,
    _launcher_variable,
    _members_test,
    _name_of,
    _nothing,
    _rank_equals,
    _role_of_name,
    _RoleMarker,
    _scope_nodes,
    _target_names,
    _world_size_test,
    call_role,
    fallback_constant,
)


class Helpers(Protocol):
    """What the project's functions return in the rank domain (`summaries.RankReturns` answers)."""

    def role(self, call: ast.Call) -> Role | None: ...

    def tuple_roles(self, call: ast.Call) -> tuple[Role | None, ...] | None: ...

    def test(self, call: ast.Call) -> RankTest | None: ...

    def attribute(self, node: ast.Attribute) -> Role | RankTest | None: ...


class RankNames:
    """The rank-holding local variables of one scope (`r = dist.get_rank()`, `main = r == 0`).

    Flow-insensitive but conservative: a name assigned anything else anywhere in the scope is dropped.
    """

    def __init__(self, body: Iterable[ast.stmt], parent: RankNames | None = None,
                 helpers: Helpers | None = None):
        # What the project's own functions return, in this domain (`summaries.py`): `rank, ws =
        # get_rank_and_world_size()`, `if is_main():` where `is_main()` returns `get_rank() == 0`.
        self.helpers: Helpers | None = helpers if helpers is not None else parent.helpers if parent else None
        self.values: dict[str, Role] = dict(parent.values) if parent else {}
        self.flags: dict[str, RankTest] = dict(parent.flags) if parent else {}
        # Rank-sounding names bound to something else here (`for rank in range(world_size)`).
        self.shadowed: set[str] = set(parent.shadowed) if parent else set()
        self.present: set[str] = set()  # parameters no call leaves None (rank_parameters.py)
        assigned: dict[str, list[ast.expr | None]] = {}
        self.assigned = assigned  # (each name's values, for the ranges of a test's parts: rank_ranges)
        placed: dict[str, list[ast.AST]] = {}  # the statement of each binding, in the same order
        scope_nodes = list(_scope_nodes(body))
        at: list[ast.AST] = [ast.Pass()]

        def add(name: str, value: ast.expr | None) -> None:
            assigned.setdefault(name, []).append(value)
            placed.setdefault(name, []).append(at[0])

        for node in scope_nodes:
            at[0] = node
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, (ast.Tuple, ast.List)) and self._unpack(target, node.value, add):
                        continue
                    for name in _target_names(target):
                        value = node.value if isinstance(target, ast.Name) else None
                        add(name, value)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                target = node.target
                value = node.value if isinstance(node, (ast.AnnAssign, ast.NamedExpr)) else None
                for name in _target_names(target):
                    add(name, value if isinstance(target, ast.Name) else None)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
                targets = [node.target] if isinstance(node, (ast.For, ast.AsyncFor)) else [
                    item.optional_vars for item in node.items if item.optional_vars is not None]
                for target in targets:
                    for name in _target_names(target):
                        add(name, None)
        self._settle(assigned)
        # A binding in a branch that a distributed run never takes does not reach a distributed run:
        # `if ddp: master = rank == 0 else: master = True` makes `master` a rank-0 test there.
        # Only names bound more than once, to values that did not settle, can change: most scopes have none.
        unsettled = any(len(values) > 1 and None not in values and name not in self.values
                        and name not in self.flags for name, values in assigned.items())
        skipped = self._single_process_branches(scope_nodes) if unsettled else set()
        kept = assigned
        if skipped:
            kept = {name: [v for v, at in zip(values, placed.get(name, ()), strict=False)
                           if id(at) not in skipped] for name, values in assigned.items()}
            self._settle({name: values for name, values in kept.items()
                          if values and len(values) < len(assigned[name])})
        # `device_id = int(os.environ["LOCAL_RANK"])` beside `device_id = -1`: the fallback is the value of
        # a run that is not distributed; a distributed run's other bindings say what it holds.
        if unsettled:
            ranked = {name: [v for v in values if not fallback_constant(v)] for name, values in kept.items()
                      if name not in self.values and name not in self.flags and None not in values}
            fell_back = {name: values for name, values in ranked.items()
                         if values and len(values) < len(kept[name])}
            self._settle(fell_back)
            if any(name in self.values or name in self.flags for name in fell_back):
                # what reads those names settles again: `stopper = S() if gpu_rank == 0 else None`
                self._settle({name: values for name, values in kept.items() if name not in fell_back
                              and name not in self.values and name not in self.flags and None not in values})
            self._made_in_rank_branches(scope_nodes, assigned, placed)

    def _made_in_rank_branches(self, nodes: list[ast.AST], assigned: dict[str, list[ast.expr | None]],
                               placed: dict[str, list[ast.AST]]) -> None:
        """`stopper = None`, then `if rank == 0: stopper = Stopper()`: an object bound only in a branch of
        a rank test, nothing (`None`, `False`, ...) elsewhere, exists on those ranks only, so `if stopper:`
        and `stopper is not None` are that test."""
        branch_of: dict[int, RankTest] = {}
        for node in nodes:
            if isinstance(node, ast.If):
                test = self.test(node.test)
                if test.is_rank_test:
                    for block, side in ((node.body, test), (node.orelse, test.negated())):
                        for stmt in _scope_nodes(block):
                            branch_of.setdefault(id(stmt), side)
        if not branch_of:
            return
        for name, values in assigned.items():
            if name in self.values or name in self.flags or None in values or len(values) < 2:
                continue
            spots = placed.get(name, [])
            made = {branch_of.get(id(at)) for value, at in zip(values, spots, strict=False)
                    if value is not None and not _nothing(value)}
            empty = [at for value, at in zip(values, spots, strict=False)
                     if value is not None and _nothing(value)]
            if len(made) == 1 and (only := made.pop()) is not None and empty and all(
                    branch_of.get(id(at)) != only for at in empty):
                self.flags[name] = only

    def _single_process_branches(self, nodes: list[ast.AST]) -> set[int]:
        """The statements (by id) in branches that only a run that is not distributed takes."""
        found: set[int] = set()
        for node in nodes:
            if not isinstance(node, ast.If):
                continue
            test = self.test(node.test)
            branch = node.orelse if test == DISTRIBUTED else (
                node.body if test == DISTRIBUTED.negated() else [])
            found.update(id(stmt) for stmt in _scope_nodes(branch))
        return found

    def _settle(self, assigned: dict[str, list[ast.expr | None]]) -> None:
        # Twice, so that `main = r == 0` is understood whichever of it and `r = get_rank()` comes first.
        for name, values in [*assigned.items(), *assigned.items()]:
            self.values.pop(name, None)
            self.flags.pop(name, None)
            self.shadowed.add(name)
            if None in values:
                continue
            roles = {self.role(v) for v in values if v is not None}
            if len(roles) == 1 and (role := roles.pop()) is not None:
                self.values[name] = role
                self.shadowed.discard(name)
                continue
            tests = {self.test(v) for v in values if v is not None}
            # A rank test, or whether the run is distributed (`ddp = world_size != 1`): the value flows on.
            if len(tests) == 1 and (
                    (test := tests.pop()).is_rank_test or test in (DISTRIBUTED, DISTRIBUTED.negated())):
                self.flags[name] = test

    def _unpack(self, target: ast.Tuple | ast.List, value: ast.expr,
                add: Callable[[str, ast.expr | None], None]) -> bool:
        """`rank, ws = dist.get_rank(), dist.get_world_size()` and `rank, ws = helper()` (a project function
        returning a tuple whose first item is a rank): each name gets its item. False when it cannot split."""
        if any(not isinstance(e, ast.Name) for e in target.elts):
            return False
        names = [e.id for e in target.elts if isinstance(e, ast.Name)]
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(names) and not any(
                isinstance(e, ast.Starred) for e in value.elts):
            for name, item in zip(names, value.elts, strict=True):
                add(name, item)
            return True
        if isinstance(value, ast.Call) and self.helpers is not None:
            roles = self.helpers.tuple_roles(value)
            if roles is not None and len(roles) == len(names):
                for name, role in zip(names, roles, strict=True):
                    add(name, _RoleMarker(role) if role is not None else None)
                return True
        return False

    def is_rank_value(self, node: ast.expr) -> bool:
        return self.role(node) is not None

    def role(self, node: ast.expr) -> Role | None:
        """What the value of `node` counts, if it holds a rank."""
        if isinstance(node, ast.Name):
            if node.id in self.values:
                return self.values[node.id]
            return None if node.id in self.shadowed else _role_of_name(node.id, attribute=False)
        if isinstance(node, ast.Attribute):
            if self.helpers is not None and isinstance(found := self.helpers.attribute(node), Role):
                return found  # `self.device_id`, kept from a constructor's rank parameter
            return _role_of_name(node.attr, attribute=True)
        if isinstance(node, _RoleMarker):
            return node.role
        if isinstance(node, ast.IfExp):
            return choice_role(self, node)
        if isinstance(node, ast.Call):
            func = node.func
            if self.helpers is not None and (found := self.helpers.role(node)) is not None:
                return found
            if isinstance(func, ast.Name):
                if func.id == "int" and len(node.args) == 1:
                    return self.role(node.args[0])
                return call_role(node, func.id)
            if isinstance(func, ast.Attribute):
                if func.attr in ("get", "getenv") and node.args:  # os.environ.get("RANK"), os.getenv("RANK")
                    return _env_role(node.args[0])
                return call_role(node, func.attr)
            return None
        if isinstance(node, ast.Subscript):  # os.environ["RANK"]
            if isinstance(node.value, ast.Attribute) and node.value.attr == "environ":
                return _env_role(node.slice)
            # `opt.gpu_ranks[device_id]`: this process's entry of a per-process list of ranks (a literal
            # index, `ranks[0]`, names one rank of a group, not this process's)
            plural = _name_of(node.value)
            if plural.endswith("_ranks") and not isinstance(node.slice, ast.Constant):
                return _role_of_name(plural[:-1], attribute=False)
            return None
        if isinstance(node, ast.BinOp):
            left, right = self.role(node.left), self.role(node.right)
            if isinstance(node.op, ast.Mod) and left == Role.GLOBAL and right is None:
                # `rank % ngpus_per_node`: the index on the node. A small literal divisor (`rank % 2`) is a
                # parity, not a per-node index.
                small = isinstance(node.right, ast.Constant) and isinstance(node.right.value, int) and (
                    node.right.value < 4)
                return None if small or may_be_one(node.right, self.assigned) else Role.LOCAL
            if isinstance(node.op, ast.FloorDiv) and left == Role.GLOBAL and right is None:
                return Role.NODE  # `rank // ngpus_per_node`
            if isinstance(node.op, (ast.Add, ast.Mult)) and (left or right):
                # `nr * gpus + gpu` is a global rank; `local_rank + 0` is still a local one.
                return left if right is None else right if left is None else Role.GLOBAL
        return None

    def test(self, test: ast.expr) -> RankTest:
        """Who takes each branch of `if test:`."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.test(test.operand).negated()
        if isinstance(test, ast.BoolOp):
            parts = [self.test(v) for v in test.values]
            then, orelse = parts[0].then, parts[0].orelse
            for part in parts[1:]:
                if isinstance(test.op, ast.And):
                    then, orelse = meet(then, part.then), join(orelse, part.orelse)
                else:
                    then, orelse = join(then, part.then), meet(orelse, part.orelse)
            return RankTest(then, orelse)
        if isinstance(test, ast.Compare):
            return self._compare(test)
        if isinstance(test, ast.NamedExpr):
            return self.test(test.value)
        if isinstance(test, ast.IfExp):
            return choice_test(self, test)  # `a if cond else b` (rank_choices)
        name = _name_of(test)
        if isinstance(test, (ast.Name, ast.Attribute)):
            if isinstance(test, ast.Name) and test.id in self.flags:
                return self.flags[test.id]
            if isinstance(test, ast.Name) and test.id in self.shadowed:
                return UNIFORM
            if isinstance(test, ast.Attribute) and self.helpers is not None and isinstance(
                    kept := self.helpers.attribute(test), RankTest):
                return kept  # `args.is_master = args.rank == 0` in another file
            flag = _flag_test(name) or (DISTRIBUTED if _distributed_flag(name) else None)
            if flag is not None:
                return flag
            role = self.role(test)
            if role is not None and "rank" in name.lower():  # `if rank:` is `if rank != 0:` (not `if gpu:`)
                return _rank_equals(role, 0).negated()
            return UNIFORM
        if isinstance(test, ast.Call):
            if self.helpers is not None and (found := self.helpers.test(test)) is not None:
                return found
            # `comm.is_main_process()`, `trainer.is_world_process_zero()`, `is_main_process(local_rank)`
            if (
                not test.args
                and not test.keywords
                or len(test.args) == 1
                and self.is_rank_value(test.args[0])
            ):
                flag = _flag_test(name)
                if flag is not None:
                    return flag
            if name in DISTRIBUTED_CALLS:
                return DISTRIBUTED
        return UNIFORM

    def polarity(self, test: ast.expr) -> Polarity:
        """Whether the body and the else-branch each run on only some of the ranks."""
        result = self.test(test)
        return result.then.restricted, result.orelse.restricted

    def _compare(self, test: ast.Compare) -> RankTest:
        if len(test.ops) != 1:
            return UNIFORM  # `0 <= rank < n`: rare, and a range of ranks is what loops over peers test
        op, left, right = test.ops[0], test.left, test.comparators[0]
        if isinstance(op, (ast.Is, ast.IsNot)):
            if (_launcher_variable(left) or isinstance(left, ast.Name) and left.id in self.present) and (
                    isinstance(right, ast.Constant) and right.value is None):
                # `os.environ.get("LOCAL_RANK") is not None` (every launcher sets it), or a rank parameter
                # that no call leaves None: the test of a distributed run, not of a rank
                return DISTRIBUTED if isinstance(op, ast.IsNot) else DISTRIBUTED.negated()
            if isinstance(right, ast.Constant) and right.value is None and self.role(left) is None and (
                    isinstance(left, (ast.Name, ast.Attribute))):
                # `stopper is not None` where `stopper = Stopper() if rank == 0 else None` (or an attribute
                # a caller fills with such a value): the object exists on those ranks only
                present = self.test(left)
                if present.is_rank_test:
                    return present if isinstance(op, ast.IsNot) else present.negated()
            return UNIFORM  # `rank is None` tells configured from unconfigured, not one rank from another
        if isinstance(op, (ast.In, ast.NotIn)) and _environment(right) and (
                isinstance(left, ast.Constant) and left.value in LAUNCHER_VARIABLES):
            return DISTRIBUTED if isinstance(op, ast.In) else DISTRIBUTED.negated()  # `"RANK" in os.environ`
        if isinstance(op, (ast.In, ast.NotIn)):
            # `rank in (0, 1)` is a rank test; `rank in group_ranks` is group membership, which code
            # uses to skip collectives of a group the rank is not in: correct, so not a rank condition.
            role = self.role(left)
            values = _constants(right)
            if role is None or values is None:
                return UNIFORM
            result = _members_test(role, values)
            return result.negated() if isinstance(op, ast.NotIn) else result
        world = _world_size_test(op, left, right)
        if world is not None:
            return world
        left_role, right_role = self.role(left), self.role(right)
        if (left_role is None) == (right_role is None):
            return UNIFORM  # no rank, or a rank against a rank (`rank == src` inside a loop over peers)
        role = left_role or right_role
        assert role is not None
        other = right if left_role is not None else left
        if _name_of(other) == "MAIN_PROCESS_RANK":
            return UNIFORM  # torch's test harness: the launcher process, rank -1
        if left_role is None:  # `0 == rank`: read it as `rank == 0`
            op = _MIRROR.get(type(op), op)
        value = _int_constant(other)
        if isinstance(op, (ast.Eq, ast.NotEq)):
            result = _rank_equals(role, value)
            return result.negated() if isinstance(op, ast.NotEq) else result
        # A rank is never negative in a distributed run: `rank > 0` is `rank != 0`, `rank <= 0` is `rank == 0`
        # (the -1 of an unlaunched run aside; `get_rank(group=g) >= 0` is g's membership, alike on all of g),
        # so `if local_rank > 0: barrier()` ... `if local_rank == 0: barrier()` is "main process first".
        if value == 0 and isinstance(op, ast.Gt) or value == 1 and isinstance(op, ast.GtE):
            return _rank_equals(role, 0).negated()
        if value == 0 and isinstance(op, ast.LtE) or value == 1 and isinstance(op, ast.Lt):
            return _rank_equals(role, 0)
        # Orderings: `rank < 2` names ranks 0 and 1; the rest is "some ranks".
        if value is not None and value >= 0 and role == Role.GLOBAL and isinstance(op, (ast.Lt, ast.LtE)):
            high = value if isinstance(op, ast.Lt) else value + 1
            if high == 0:
                return RankTest(NONE, ALL)  # `rank < 0`: not launched distributed
            return RankTest(RankSet(Ranks.SOME, frozenset(range(high))), SOME)
        if value is not None and (value < 0 or value == 0 and isinstance(op, ast.GtE)):
            return UNIFORM if isinstance(op, (ast.Gt, ast.GtE)) else RankTest(NONE, ALL)
        return RankTest(SOME, SOME)
