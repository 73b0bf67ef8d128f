"""The rank sources: the names, attributes, methods and environment variables that hold a rank, the flags
that say "main process", the tests of whether a run is distributed, and the small readers of a test's
parts (`rank == 0`, `rank in (0, 1)`, `world_size > 1`). By what they compute; the project's own helpers
are read by `summaries.py`."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import replace

from .rank_sets import ALL, DISTRIBUTED, NONE, RANK_ZERO, SOME, Ranks, RankSet, RankTest, Role, join
from .source import last_name

# Names and attributes that hold a rank, by what they count. `x.rank` covers `self.rank`,
# `trainer.global_rank`, `rank_zero_only.rank`; `pg.rank()` is ProcessGroup.rank().
GLOBAL_NAMES = frozenset(
    {"rank", "global_rank", "my_rank", "process_index", "world_rank", "proc_id", "rank_id", "gpu_rank"}
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



_ROLE_KIND = {Role.GLOBAL: Ranks.ONE_RANK, Role.LOCAL: Ranks.ONE_PER_NODE, Role.NODE: Ranks.NODE,
              Role.GROUP: Ranks.ONE_RANK}


def _rank_equals(role: Role, value: int | None) -> RankTest:
    """`rank == value` (value None: not a constant, `rank == src`)."""
    if role == Role.GROUP:  # read as a global rank, its sets marked as chosen within groups
        found = _rank_equals(Role.GLOBAL, value)
        return RankTest(replace(found.then, subgroup=True), replace(found.orelse, subgroup=True))
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
    name = name.lstrip("_")  # a module's private copy (`__rank`, `self._local_rank`) is the same value
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
    return last_name(node.func if isinstance(node, ast.Call) else node)


def fallback_constant(value: ast.expr | None) -> bool:
    """`None`, `0`, `-1`, `True`, `False`: what a rank or a rank test is set to in a run that is not
    distributed (`local_rank = -1`, `master = True`), beside the binding a distributed run makes."""
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub):
        value = value.operand
    return isinstance(value, ast.Constant) and (value.value is None or value.value in (0, 1, True, False))


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


# Text without which no rank condition can be spelled (see ranks.py): the per-function pre-filter.
RANK_WORDS = (
    "rank",
    "RANK",
    "_zero",
    "main_process",
    "last_process",
    "master",
    "PROCID",
    "LOCALID",
    "on_process",
    "on_local_process",
    "is_primary",
    "is_main",
    "is_chief",
    "is_root",
    "gpu",
    ".nr",
    "NODEID",
    "process_index",
    "node_id",
    "should_save",
    "should_log",
    "is_local",
    "proc_id",
)
# Lightning's and accelerate's, mmcv/mmengine's `master_only`, and the `main_process` of the LAVIS/BLIP
# family's dist_utils (copied into many repositories). A project decorator of another name that runs the
# function under a rank test is not read (its body is not followed: rule pages, Known problems).
RANK_ZERO_DECORATORS = {
    "rank_zero_only": RANK_ZERO, "on_main_process": RANK_ZERO, "master_only": RANK_ZERO,
    "main_process": RANK_ZERO,
    "on_local_main_process": RankSet(Ranks.ONE_PER_NODE), "on_last_process": RankSet(Ranks.ONE_RANK),
    "on_process": RankSet(Ranks.ONE_RANK), "on_local_process": RankSet(Ranks.ONE_PER_NODE),
}


Function = ast.FunctionDef | ast.AsyncFunctionDef


def rank_zero_decorator(func: Function) -> ast.expr | None:
    """The `@rank_zero_only` (or accelerate `@on_main_process`, ...) decorator of a function, if any."""
    for deco in func.decorator_list:
        if _decorator_name(deco) in RANK_ZERO_DECORATORS:
            return deco
    return None


def _decorator_name(deco: ast.expr) -> str:
    target = deco.func if isinstance(deco, ast.Call) else deco
    return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")


def _nothing(node: ast.expr) -> bool:
    """`None`, `False`, `0`, `""`, an empty literal: a value no `if` takes."""
    if isinstance(node, ast.Constant):
        return not node.value
    return isinstance(node, (ast.List, ast.Tuple, ast.Dict, ast.Set)) and not (
        node.keys if isinstance(node, ast.Dict) else node.elts)


# Set by torchrun, torch.distributed.launch, accelerate, DeepSpeed's and Lightning's launchers in every
# process they start, and by none of them in a plain `python train.py`.
LAUNCHER_VARIABLES = frozenset({"LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"})


def _environment(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _launcher_variable(node: ast.expr) -> bool:
    """`os.environ.get("LOCAL_RANK")`, `os.getenv("RANK")`, `os.environ["WORLD_SIZE"]`."""
    if isinstance(node, ast.Subscript):
        key = node.slice
        return _environment(node.value) and isinstance(key, ast.Constant) and key.value in LAUNCHER_VARIABLES
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return False
    func = node.func
    reads = isinstance(func, ast.Attribute) and (
        func.attr == "get" and _environment(func.value) or func.attr == "getenv")
    return reads and node.args[0].value in LAUNCHER_VARIABLES


GROUP_KEYWORDS = ("group", "process_group", "pg")


def _group_text(node: ast.expr) -> str | None:
    """A named group's text; None for the default group (`None`, `group.WORLD`) or a literal."""
    if isinstance(node, ast.Constant) or last_name(node) == "WORLD":
        return None
    return ast.unparse(node)


def _names_a_group(node: ast.expr) -> bool:
    name = last_name(node).lower()
    return name.endswith("group") or name.endswith("pg")


def rank_in_group(call: ast.Call) -> str | None:
    """`g.rank()` on a group, `dist.get_rank(group=g)`, `dist.get_rank(g)`: the group's text."""
    func = call.func
    if not isinstance(func, ast.Attribute) and not isinstance(func, ast.Name):
        return None
    name = func.attr if isinstance(func, ast.Attribute) else func.id
    if name == "rank" and isinstance(func, ast.Attribute) and not call.args and _names_a_group(func.value):
        return _group_text(func.value)
    if name == "get_global_rank" and len(call.args) == 1 and _names_a_group(call.args[0]):
        return _group_text(call.args[0])  # a wrapper's `get_global_rank(group)`: torch's takes two
    if name == "get_rank":
        group = call.args[0] if call.args else next(
            (kw.value for kw in call.keywords if kw.arg in GROUP_KEYWORDS), None)
        return _group_text(group) if group is not None else None
    return None


def call_role(call: ast.Call, name: str) -> Role | None:
    """What a call named `name` returns: the rank in a named group (`tp_group.rank()`), or by its name."""
    return Role.GROUP if rank_in_group(call) is not None else _role_of_method(name)
