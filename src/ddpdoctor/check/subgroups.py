"""Whether a rank test picks whole process groups of the collective it guards (DDP101).

A test that reads only this process's rank in named subgroups (`tp_group.rank() == 0`,
`dist.get_rank(group=tp) == 0`) around a collective on another named group (`group=pp_group`): in the grid
that tensor-, pipeline- and data-parallel programs build, the members of one group share their rank in each
of the others (every rank of a pipeline group has the same tensor-parallel rank), so all of the collective's
group takes the same branch. A test of the rank in the collective's own group, or of any other rank (the
global rank, a flag), still splits it. A helper or an attribute that holds a group's rank is read as one
(`Role.GROUP`, whose sets are `RankSet.subgroup`): `self.instance_id = get_pg_rank(inter_group)`."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from ..findings import Fix
from .rank_sources import (
    GROUP_KEYWORDS,
    LOCAL_METHODS,
    LOCAL_NAMES,
    RANK_FLAGS,
    RANK_NAMES,
    _group_text,
    _names_a_group,
    rank_in_group,
)
from .source import last_name

if TYPE_CHECKING:
    from .facts import Step
    from .guards import Guard, GuardedCall
    from .project import ProjectIndex
    from .rank_sets import RankSet
    from .source import SourceFile


def collective_group(call: ast.Call) -> str | None:
    """The named group a collective runs on (`group=dp_group`, or a positional argument named as a group:
    `all_gather(out, t, dp_group)`); None for the default group."""
    for kw in call.keywords:
        if kw.arg in GROUP_KEYWORDS:
            return _group_text(kw.value)
    return next((_group_text(arg) for arg in call.args if _names_a_group(arg)), None)


def tested_groups(test: ast.expr, local: bool = False) -> tuple[frozenset[str], bool] | None:
    """The groups whose rank `test` reads, when it reads no other rank: None otherwise (a global rank, a
    rank flag, a call it cannot read). With `local`, the local rank may be read too, and the second item
    says whether it is."""
    found: set[str] = set()
    locals_read: list[ast.expr] = []

    def reads(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.BoolOp):
            return all(reads(value) for value in node.values)
        if isinstance(node, ast.UnaryOp):
            return reads(node.operand)
        if isinstance(node, ast.Compare):
            return reads(node.left) and all(reads(part) for part in node.comparators)
        if isinstance(node, ast.Call):
            group = rank_in_group(node)
            if group is not None:
                found.add(group)
            elif local and not node.args and last_name(node.func) in LOCAL_METHODS:
                locals_read.append(node)  # `dist.get_local_rank()`
                return True
            return group is not None
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = last_name(node).lstrip("_")
            if local and name in LOCAL_NAMES:
                locals_read.append(node)
                return True
            return name not in RANK_NAMES and name not in RANK_FLAGS and "rank" not in name
        return False

    return (frozenset(found), bool(locals_read)) if reads(test) and (found or locals_read) else None


def local_within_mesh_group(source: SourceFile, test: ast.expr, group: str | None) -> bool:
    """The collective runs on a group of a device mesh (`mesh.get_group(i)`, `mesh["dp"].get_group()`) and
    `test` reads the local rank, besides at most the rank in other groups: whether the members of the group
    agree on the local rank depends on the layout (they do where the mesh's inner dimensions span whole
    nodes), which the source does not show. Hedged, never asserted: DDP101 says the test may split the
    group."""
    if group is None:
        return False
    found = tested_groups(test, local=True)
    if found is None or group in found[0] or not found[1]:
        return False
    made = [node.value for node in ast.walk(source.tree) if isinstance(node, ast.Assign)
            and any(ast.unparse(t) == group for t in node.targets)]
    return bool(made) and all(isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                              and value.func.attr == "get_group" for value in made)


def whole_groups(test: ast.expr, group: str | None, call: ast.Call | None = None, subgroup: bool = False
                 ) -> bool:
    """The collective runs on `group`, named, and `test` reads only the rank in other groups; `call`, the
    guarded call of a project function that reaches it, passes none of those groups on (`helper(tp_group)`
    may run its collective on it). `subgroup`: the test's sets are chosen within groups (`RankSet.subgroup`:
    a helper or an attribute that holds `get_rank(group=...)`), where the test's text does not name them;
    then the test must not name the collective's group at all (`is_first(dp_group)`)."""
    read = tested_groups(test)
    tested = read[0] if read is not None else None
    if group is None or tested is not None and group in tested:
        return False
    if tested is None:
        return subgroup and group not in {ast.unparse(node) for node in ast.walk(test)}
    given = (*call.args, *(kw.value for kw in call.keywords)) if call is not None else ()
    return not {ast.unparse(arg) for arg in given} & tested


def chain_group(project: ProjectIndex, steps: tuple[Step, ...]) -> str | None:
    """The named group of the collective at the end of a chain across files (its function's summary)."""
    module = project.modules.get(steps[-1].path)
    if module is None:
        return None
    return next((f.collective_group for f in module.functions.values() if f.collective == steps[-1]), None)


def made_only_under(source: SourceFile, calls: list[GuardedCall], group: str | None, ranks: RankSet,
                    test: ast.expr | None = None) -> bool:
    """Every place the file makes `group` (`self.g = init_process_group(..., rank=0)`, `g = new_group(...)`)
    is under a rank test that lets the same ranks through as `ranks`, the collective's guard (its own guard
    does, or an `if` around it tests `test`, the collective's test, alone or as one of an `and`): only
    those ranks hold the group, so only they can be its members (the others of the job are outside it, as a
    group made on rank 0 with peers in other programs is), and all of them make its collective."""
    if group is None or group not in source.text:
        return False
    made = {id(node.value): node.value for node in ast.walk(source.tree) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call) and any(ast.unparse(t) == group for t in node.targets)}
    wanted, text = (ranks.kind, ranks.members), ast.unparse(test) if test is not None else None
    guarded = {id(g.call): g.guard for g in calls if id(g.call) in made}
    tests = [node for node in ast.walk(source.tree) if isinstance(node, ast.If) and text is not None
             and text in (ast.unparse(part) for part in _conjuncts(node.test))]

    def under(call: ast.Call) -> bool:
        guard = guarded.get(id(call))
        if guard is not None and guard.ranks.restricted and (guard.ranks.kind, guard.ranks.members) == wanted:
            return True
        return any(node.body[0].lineno <= call.lineno <= (node.body[-1].end_lineno or 0) for node in tests)

    return bool(made) and all(under(call) for call in made.values())


def _conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [part for value in test.values for part in _conjuncts(value)]
    return [test]



def mesh_layout_hedge(source: SourceFile, test: ast.expr | None, group: str | None, label: str, guard: Guard
                      ) -> dict[str, Any] | None:
    """DDP101's hedged finding (message, fix, facts) for a local-rank test around a collective on a mesh
    group (`local_within_mesh_group`); None for any other."""
    if test is None or group is None or not local_within_mesh_group(source, test, group):
        return None
    return {"message": f"`{label}` runs on the mesh group `{group}` under `{guard.description}` (line "
                       f"{guard.line}), which reads the local rank: it may split the group. Its members pass "
                       "the test together only where the mesh's inner dimensions span whole nodes; elsewhere "
                       "those that fail it never join and the others wait",
            "fix": Fix(message="test the rank in the mesh's own dimensions (`mesh.get_local_rank(dim)`), the "
                               "same on every member of a group of the other dimension"),
            "facts": {"collective": label, "guard_line": guard.line, "by_layout": True}}
