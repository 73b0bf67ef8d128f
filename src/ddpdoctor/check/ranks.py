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
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from .source import SourceFile


class Role(enum.Enum):
    """What a rank-holding value counts."""

    GLOBAL = "global rank"
    LOCAL = "local rank"  # the process's index on its node (its GPU)
    NODE = "node rank"  # the node's index: the same for every process of a node


class Ranks(enum.Enum):
    """The processes that take a branch, in a distributed run."""

    NONE = "no process of a distributed run"  # the branch a single-process run takes
    RANK_ZERO = "global rank 0"
    ONE_RANK = "one rank"
    ONE_PER_NODE = "one process per node"
    NODE = "every process of one node"
    SOME = "some ranks"
    ALL = "every rank"


@dataclass(frozen=True)
class RankSet:
    kind: Ranks
    # The global ranks in the set, where the test names them (`rank in (0, 1)`, `rank < 2`).
    members: frozenset[int] | None = None

    @property
    def restricted(self) -> bool:
        """Some ranks of a distributed run take it, but not all: the others skip what it holds."""
        return self.kind not in (Ranks.ALL, Ranks.NONE)

    @property
    def one_writer_per_node(self) -> bool:
        """At most one process per node (per local file system) runs under it."""
        return self.kind in (Ranks.NONE, Ranks.RANK_ZERO, Ranks.ONE_RANK, Ranks.ONE_PER_NODE)

    def covers(self, members: frozenset[int]) -> bool:
        """Every one of `members` is in this set (a group's collective reached by the whole group)."""
        if self.kind == Ranks.ALL:
            return True
        return self.members is not None and members <= self.members


ALL = RankSet(Ranks.ALL)
NONE = RankSet(Ranks.NONE, frozenset())
SOME = RankSet(Ranks.SOME)
RANK_ZERO = RankSet(Ranks.RANK_ZERO, frozenset({0}))


def meet(a: RankSet, b: RankSet) -> RankSet:
    """The processes in both (`a and b`): never more writers than either."""
    if a.kind == Ranks.ALL:
        return b
    if b.kind == Ranks.ALL:
        return a
    members = a.members & b.members if a.members is not None and b.members is not None else (
        a.members if a.members is not None else b.members)
    kinds = {a.kind, b.kind}
    if Ranks.NONE in kinds:
        kind = Ranks.NONE
    elif a.kind == b.kind:
        kind = a.kind
    elif Ranks.RANK_ZERO in kinds:
        kind = Ranks.RANK_ZERO
    elif Ranks.ONE_RANK in kinds:
        kind = Ranks.ONE_RANK
    elif kinds == {Ranks.ONE_PER_NODE, Ranks.NODE}:
        kind = Ranks.ONE_RANK  # the local rank 0 of one node
    elif Ranks.ONE_PER_NODE in kinds:
        kind = Ranks.ONE_PER_NODE
    else:
        kind = Ranks.SOME
    return RankSet(kind, members)


def join(a: RankSet, b: RankSet) -> RankSet:
    """The processes in either (`a or b`)."""
    if a.kind == Ranks.NONE:
        return b
    if b.kind == Ranks.NONE:
        return a
    members = a.members | b.members if a.members is not None and b.members is not None else None
    kinds = {a.kind, b.kind}
    if Ranks.ALL in kinds:
        return ALL
    if a.kind == b.kind and a.kind != Ranks.ONE_RANK:
        kind = a.kind
    elif kinds == {Ranks.RANK_ZERO, Ranks.ONE_PER_NODE}:
        kind = Ranks.ONE_PER_NODE  # rank 0 is local rank 0 of its node
    elif kinds == {Ranks.RANK_ZERO, Ranks.NODE}:
        kind = Ranks.NODE
    else:
        kind = Ranks.SOME
    return RankSet(kind, members)


@dataclass(frozen=True)
class RankTest:
    """Who takes the body (`then`) and who takes the else-branch (`orelse`) of a test."""

    then: RankSet
    orelse: RankSet

    @property
    def is_rank_test(self) -> bool:
        return self.then.restricted or self.orelse.restricted

    def negated(self) -> RankTest:
        return RankTest(self.orelse, self.then)


UNIFORM = RankTest(ALL, ALL)
# True only in a run that is not distributed: `not dist.is_initialized()`, `world_size == 1`.
DISTRIBUTED = RankTest(ALL, NONE)

# Compatibility view for callers that only need "is each side restricted?".
Polarity = tuple[bool, bool]
NOT_RANK: Polarity = (False, False)

# Names and attributes that hold a rank, by what they count. `x.rank` covers `self.rank`,
# `trainer.global_rank`, `rank_zero_only.rank`; `pg.rank()` is ProcessGroup.rank().
GLOBAL_NAMES = frozenset(
    {"rank", "global_rank", "my_rank", "process_index", "world_rank", "proc_id", "rank_id"}
)
LOCAL_NAMES = frozenset({"local_rank", "local_process_index", "local_rank_id", "gpu", "gpu_id", "local_gpu"})
NODE_NAMES = frozenset({"node_rank", "node_id", "machine_rank", "group_rank"})
NODE_ATTRS = NODE_NAMES | {"nr"}  # `args.nr` of the classic multi-node tutorial (rank = nr * gpus + gpu)
RANK_NAMES = GLOBAL_NAMES | LOCAL_NAMES | NODE_NAMES
RANK_ATTRS = RANK_NAMES | NODE_ATTRS
GLOBAL_METHODS = frozenset({"get_rank", "get_global_rank", "rank", "get_process_index"})
LOCAL_METHODS = frozenset({"get_local_rank", "get_node_local_rank", "local_rank"})
NODE_METHODS = frozenset({"get_node_rank", "node_rank", "get_group_rank"})
RANK_METHODS = GLOBAL_METHODS | LOCAL_METHODS | NODE_METHODS
RANK_ENV = {"RANK": Role.GLOBAL, "SLURM_PROCID": Role.GLOBAL, "OMPI_COMM_WORLD_RANK": Role.GLOBAL,
            "PMI_RANK": Role.GLOBAL, "LOCAL_RANK": Role.LOCAL, "SLURM_LOCALID": Role.LOCAL,
            "OMPI_COMM_WORLD_LOCAL_RANK": Role.LOCAL, "NODE_RANK": Role.NODE, "GROUP_RANK": Role.NODE,
            "SLURM_NODEID": Role.NODE}
# Booleans true on one rank, or on one process per node (Lightning, Fabric, accelerate, HF, common spellings).
GLOBAL_ZERO_FLAGS = frozenset(
    {
        "is_global_zero",
        "is_main_process",
        "is_rank_zero",
        "is_master",
        "is_main_rank",
        "is_world_process_zero",
        "is_primary",
        "is_main",
        "is_rank_0",
        "is_rank0",
        "is_global_main_process",
        "is_master_process",
        "is_chief",
        "is_root_worker",
        "is_root_process",
        "is_root_rank",
    }
)
# HF TrainingArguments' `should_save` / `should_log` hold on the main process (or on each node's, with
# `save_on_each_node` / `log_on_each_node`); torch_xla's `is_master_ordinal()` is local by default.
LOCAL_ZERO_FLAGS = frozenset(
    {
        "is_local_main_process",
        "is_local_zero",
        "is_local_process_zero",
        "is_local_master",
        "is_local_primary",
        "is_local_rank_zero",
        "should_save",
        "should_log",
        "is_master_ordinal",
    }
)
ONE_RANK_FLAGS = frozenset({"is_last_process"})
RANK_FLAGS = GLOBAL_ZERO_FLAGS | LOCAL_ZERO_FLAGS | ONE_RANK_FLAGS
# Functions that answer "am I the main process?" when called (detectron2's comm.is_main_process(), timm's
# is_primary(), HF's trainer.is_world_process_zero()).
RANK_PREDICATES = RANK_FLAGS
# Whether the run is distributed at all: the same answer on every rank, and a single-process run's branch.
DISTRIBUTED_FLAGS = frozenset(
    {
        "distributed",
        "is_distributed",
        "multiprocessing_distributed",
        "ddp",
        "use_ddp",
        "is_ddp",
        "use_distributed",
        "dist_enabled",
        "is_dist",
    }
)
# (`is_available()` is true in every distributed run, whatever it is in others.)
DISTRIBUTED_CALLS = frozenset({"is_initialized", "is_available", "is_dist_avail_and_initialized",
                               "is_distributed", "is_dist_initialized", "is_torch_distributed_initialized"})
WORLD_SIZES = frozenset({"world_size", "num_processes", "get_world_size", "num_gpus", "n_gpus", "ngpus",
                         "WORLD_SIZE", "world_size_", "nprocs"})

class _RoleMarker(ast.expr):
    """An item of a helper's returned tuple whose role is known (`rank` in `rank, ws = helper()`)."""

    def __init__(self, role: Role):
        super().__init__()
        self.role = role


class Helpers(Protocol):
    """What the project's functions return in the rank domain (`summaries.RankReturns` answers)."""

    def role(self, call: ast.Call) -> Role | None: ...

    def tuple_roles(self, call: ast.Call) -> tuple[Role | None, ...] | None: ...

    def test(self, call: ast.Call) -> RankTest | None: ...


_ROLE_KIND = {Role.GLOBAL: Ranks.ONE_RANK, Role.LOCAL: Ranks.ONE_PER_NODE, Role.NODE: Ranks.NODE}


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
        assigned: dict[str, list[ast.expr | None]] = {}
        placed: dict[str, list[ast.AST]] = {}  # the statement of each binding, in the same order
        scope_nodes = list(_scope_nodes(body))
        for node in scope_nodes:
            before = {name: len(values) for name, values in assigned.items()}
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, (ast.Tuple, ast.List)) and self._unpack(
                            target, node.value, assigned):
                        continue
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
            for name, values in assigned.items():
                placed.setdefault(name, []).extend([node] * (len(values) - before.get(name, 0)))
        self._settle(assigned)
        # A binding in a branch that a distributed run never takes does not reach a distributed run:
        # `if ddp: master = rank == 0 else: master = True` makes `master` a rank-0 test there.
        skipped = self._single_process_branches(scope_nodes)
        if skipped:
            kept = {name: [v for v, at in zip(values, placed.get(name, ()), strict=False)
                           if id(at) not in skipped] for name, values in assigned.items()}
            self._settle({name: values for name, values in kept.items()
                          if values and len(values) < len(assigned[name])})

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
                assigned: dict[str, list[ast.expr | None]]) -> bool:
        """`rank, ws = dist.get_rank(), dist.get_world_size()` and `rank, ws = helper()` (a project function
        returning a tuple whose first item is a rank): each name gets its item. False when it cannot split."""
        if any(not isinstance(e, ast.Name) for e in target.elts):
            return False
        names = [e.id for e in target.elts if isinstance(e, ast.Name)]
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(names) and not any(
                isinstance(e, ast.Starred) for e in value.elts):
            for name, item in zip(names, value.elts, strict=True):
                assigned.setdefault(name, []).append(item)
            return True
        if isinstance(value, ast.Call) and self.helpers is not None:
            roles = self.helpers.tuple_roles(value)
            if roles is not None and len(roles) == len(names):
                for name, role in zip(names, roles, strict=True):
                    assigned.setdefault(name, []).append(_RoleMarker(role) if role is not None else None)
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
            return _role_of_name(node.attr, attribute=True)
        if isinstance(node, _RoleMarker):
            return node.role
        if isinstance(node, ast.Call):
            func = node.func
            if self.helpers is not None and (found := self.helpers.role(node)) is not None:
                return found
            if isinstance(func, ast.Name):
                if func.id == "int" and len(node.args) == 1:
                    return self.role(node.args[0])
                return _role_of_method(func.id)
            if isinstance(func, ast.Attribute):
                if func.attr in ("get", "getenv") and node.args:  # os.environ.get("RANK"), os.getenv("RANK")
                    return _env_role(node.args[0])
                return _role_of_method(func.attr)
            return None
        if isinstance(node, ast.Subscript):  # os.environ["RANK"]
            if isinstance(node.value, ast.Attribute) and node.value.attr == "environ":
                return _env_role(node.slice)
            return None
        if isinstance(node, ast.BinOp):
            left, right = self.role(node.left), self.role(node.right)
            if isinstance(node.op, ast.Mod) and left == Role.GLOBAL and right is None:
                # `rank % ngpus_per_node`: the index on the node. A small literal divisor (`rank % 2`) is a
                # parity, not a per-node index.
                small = isinstance(node.right, ast.Constant) and isinstance(node.right.value, int) and (
                    node.right.value < 4)
                return None if small else Role.LOCAL
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
        name = _name_of(test)
        if isinstance(test, (ast.Name, ast.Attribute)):
            if isinstance(test, ast.Name) and test.id in self.flags:
                return self.flags[test.id]
            if isinstance(test, ast.Name) and test.id in self.shadowed:
                return UNIFORM
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
            return UNIFORM  # `rank is None` tells configured from unconfigured, not one rank from another
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
        # Orderings: `rank < 2` names ranks 0 and 1; the rest is "some ranks".
        if value is not None and value >= 0 and role == Role.GLOBAL and isinstance(op, (ast.Lt, ast.LtE)):
            high = value if isinstance(op, ast.Lt) else value + 1
            if high == 0:
                return RankTest(NONE, ALL)  # `rank < 0`: not launched distributed
            return RankTest(RankSet(Ranks.SOME, frozenset(range(high))), SOME)
        if value is not None and value < 0:
            return UNIFORM if isinstance(op, (ast.Gt, ast.GtE)) else RankTest(NONE, ALL)
        return RankTest(SOME, SOME)


def _rank_equals(role: Role, value: int | None) -> RankTest:
    """`rank == value` (value None: not a constant, `rank == src`)."""
    if value is not None and value < 0:
        return RankTest(NONE, ALL)  # `rank == -1`: not launched distributed
    if role == Role.GLOBAL:
        return RankTest(RANK_ZERO if value == 0 else RankSet(
            Ranks.ONE_RANK, frozenset({value}) if value is not None else None), SOME)
    return RankTest(RankSet(_ROLE_KIND[role]), SOME)


_MIRROR: dict[type, ast.cmpop] = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt(), ast.LtE: ast.GtE(), ast.GtE: ast.LtE()}


def _members_test(role: Role, values: list[int]) -> RankTest:
    """`rank in (0, 1)`, `local_rank in (-1, 0)`: -1 is the "not distributed" value."""
    then = NONE
    if role != Role.GLOBAL and len({v for v in values if v >= 0}) > 1:
        return RankTest(SOME, SOME)  # `local_rank in (0, 1)`: two processes per node
    for value in values:
        if value < 0:
            continue
        if role == Role.GLOBAL:
            one = RANK_ZERO if value == 0 else RankSet(Ranks.ONE_RANK, frozenset({value}))
        else:
            one = RankSet(_ROLE_KIND[role])
        then = join(then, one)
    return RankTest(then, SOME if then.kind != Ranks.NONE else ALL)


def _world_size_test(op: ast.cmpop, left: ast.expr, right: ast.expr) -> RankTest | None:
    """`world_size > 1` is true on every rank of a distributed run; `world_size == 1` on none."""
    if _world_size_name(left) not in WORLD_SIZES:
        return None
    value = _int_constant(right)
    if value not in (1, 2):
        return None
    single = isinstance(op, ast.Eq) and value == 1 or isinstance(op, ast.Lt) and value == 2 or isinstance(
        op, ast.LtE) and value == 1
    multi = isinstance(op, ast.Gt) and value == 1 or isinstance(op, ast.GtE) and value == 2 or isinstance(
        op, ast.NotEq) and value == 1
    return DISTRIBUTED.negated() if single else DISTRIBUTED if multi else None


def _world_size_name(node: ast.expr) -> str:
    """`world_size`, `int(world_size)`, `int(os.environ.get("WORLD_SIZE", 1))`: the name the size is read
    under."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "int" and node.args:
        node = node.args[0]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
            "get", "getenv") and node.args:
        key = node.args[0]
        return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else ""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and (
            node.value.attr == "environ"):
        key = node.slice
        return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else ""
    return _name_of(node)


def _flag_test(name: str) -> RankTest | None:
    if name in GLOBAL_ZERO_FLAGS:
        return RankTest(RANK_ZERO, SOME)
    if name in LOCAL_ZERO_FLAGS:
        return RankTest(RankSet(Ranks.ONE_PER_NODE), SOME)
    if name in ONE_RANK_FLAGS:
        return RankTest(RankSet(Ranks.ONE_RANK), SOME)
    return None


def _distributed_flag(name: str) -> bool:
    return name in DISTRIBUTED_FLAGS


def _role_of_name(name: str, *, attribute: bool) -> Role | None:
    if name in GLOBAL_NAMES:
        return Role.GLOBAL
    if name in LOCAL_NAMES:
        return Role.LOCAL
    if name in (NODE_ATTRS if attribute else NODE_NAMES):
        return Role.NODE
    return None


def _role_of_method(name: str) -> Role | None:
    if name in GLOBAL_METHODS:
        return Role.GLOBAL
    if name in LOCAL_METHODS:
        return Role.LOCAL
    if name in NODE_METHODS:
        return Role.NODE
    return None


def _env_role(node: ast.expr) -> Role | None:
    return (
        RANK_ENV.get(node.value) if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
    )


def _name_of(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _int_constant(node: ast.expr) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_constant(node.operand)
        return -inner if inner is not None else None
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lstrip("-").isdigit():
        return int(node.value)  # `os.environ.get("LOCAL_RANK", "0") == "0"`
    return None


def _constants(node: ast.expr) -> list[int] | None:
    if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return None
    values = [_int_constant(e) for e in node.elts]
    return None if any(v is None for v in values) else values  # type: ignore[return-value]


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
