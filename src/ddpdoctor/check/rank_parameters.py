"""A parameter as a rank by what the project's calls pass to it, not by its name.

`setup_logger(name, out, get_rank())` fills `distributed_rank` with the process's rank, so the helper's
`if distributed_rank > 0: return` is a rank test; `save(state, path, local_rank=rank)` fills `local_rank`
with a rank at every call that passes it and never leaves it None (its default is `0`), so
`if local_rank is not None and local_rank != 0: return` lets rank 0 alone go on: `local_rank is not None`
holds on every process of a distributed run. A parameter is read so only when every call of the project
tells what it passes there: a rank value (`RankArgument`, read in the caller's scope, or what a project
helper returns), the caller's own parameter passed on unchanged (read the same way, a few hops up), or a
fallback constant (`0`, `-1`, `None`, `False`: what a run that is not distributed passes, as `ranks.py`
reads it beside a rank binding); a default fills a call that leaves it out. One other argument, a
`*args`, or a nested function handed to a helper (whose arguments are not read) and it is no rank. Roles
that differ between calls join to the local rank (global rank 0 is local rank 0 of its node); a node rank
or a group's rank beside another role is no rank. `p is None` is read as the test of a run that is not
distributed only where no call leaves it None.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .attributes import called_parameter
from .facts import Target
from .rank_sets import Role

if TYPE_CHECKING:
    from .attributes import RankArgument
    from .project import ProjectIndex
    from .ranks import RankNames
    from .source import SourceFile

MAX_HOPS = 4  # a caller's parameter passed on unchanged: read up this many callers


@dataclass(frozen=True)
class PassedRank:
    """What every call passes to one parameter: a rank of `role`; `never_none`: no call leaves it None."""

    role: Role
    never_none: bool


def parameter_ranks(project: ProjectIndex, target: Target, func: ast.FunctionDef | ast.AsyncFunctionDef
                    ) -> dict[str, PassedRank]:
    """The parameters of `func` (the project function `target`) that every call fills with a rank."""
    index = _index(project)
    if target not in index:
        return {}  # no call of the project passes a rank to it: nothing to read
    args = func.args
    params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    found: dict[str, PassedRank] = {}
    for position in sorted({i for i, _, _ in index[target]}):
        if 0 <= position < len(params) and (passed := _passed(project, target, position, 0)) is not None:
            found[params[position]] = passed
    return found


def passed_into(project: ProjectIndex, path: str) -> bool:
    """Some call passes a rank to a function of `path`: the file's rank tests need the project (second
    pass), which the first pass, its file alone, does not read."""
    return any(target.path == path for target in _index(project))


def _index(project: ProjectIndex) -> dict[Target, dict[tuple[int, str, int], RankArgument]]:
    """The rank arguments of the project by the function called: (parameter index, file, line) -> it."""
    cached = project.__dict__.get("_passed_rank_index")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    index: dict[Target, dict[tuple[int, str, int], RankArgument]] = {}
    for module in project.modules.values():
        for argument in module.rank_arguments:
            called = called_parameter(project, argument)
            if called is not None:
                index.setdefault(called[0], {})[(called[1], module.path, argument.line)] = argument
    project.__dict__["_passed_rank_index"] = index
    return index


def _passed(project: ProjectIndex, target: Target, position: int, hops: int) -> PassedRank | None:
    memo: dict[tuple[Target, int], PassedRank | None] = project.__dict__.setdefault("_passed_ranks", {})
    key = (target, position)
    if key not in memo:
        memo[key] = None  # (a cycle of calls passing it on: nothing known)
        memo[key] = _read(project, target, position, hops)
    return memo[key]


def _read(project: ProjectIndex, target: Target, position: int, hops: int) -> PassedRank | None:
    found = project.function(target)
    sites = project.callers(target)
    if found is None or not sites or hops > MAX_HOPS or not 0 <= position < len(found[1].params):
        return None
    summary = found[1]
    name = summary.params[position]
    defaults = dict(summary.defaults)
    arguments = _index(project).get(target, {})
    roles: set[Role] = set()
    never_none = True
    for caller, site in sites:
        if site.passed_to is not None or site.arity is None:
            return None
        offset = 1 if site.bound or "." not in site.target.name and site.target.name[:1].isupper() else 0
        positional, keywords = site.arity
        at: int | str | None = position - offset if 0 <= position - offset < positional else (
            name if name in keywords else None)
        if at is None:  # left out: the default fills it (a literal one, read by the summary)
            if position not in defaults or not _fallback(defaults[position]):
                return None
            never_none = never_none and defaults[position] is not None
            continue
        given = dict(site.constants).get(at, ...)
        if given is not ...:
            if not _fallback(given):
                return None
            never_none = never_none and given is not None
            continue
        argument = arguments.get((position, caller.path, site.line))
        role = _role(project, argument) if argument is not None else None
        if role is None:
            flowed = dict(site.flows).get(at)
            upstream = _passed(project, caller, flowed, hops + 1) if flowed is not None else None
            if upstream is None:
                return None
            role, never_none = upstream.role, never_none and upstream.never_none
        roles.add(role)
    if not roles:
        return None  # only fallbacks: no call passes a rank
    if len(roles) > 1:
        if not roles <= {Role.GLOBAL, Role.LOCAL}:
            return None
        roles = {Role.LOCAL}
    return PassedRank(roles.pop(), never_none)


def _role(project: ProjectIndex, argument: RankArgument) -> Role | None:
    if argument.role is not None:
        return argument.role
    returned = project.returned(argument.via) if argument.via is not None else None
    if returned is not None and returned.unless_passed is None and not returned.tuple_items and (
            returned.roles and returned.roles[0] is not None):
        return returned.roles[0]
    return None


def _fallback(value: object) -> bool:
    """A literal that a run that is not distributed passes for a rank (`-1`, `0`, `None`, `False`)."""
    return value is None or type(value) in (int, bool) and value in (-1, 0)


def passed_ranks(source: SourceFile, outer: ast.AST | None, cls: ast.ClassDef | None,
                 func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, PassedRank]:
    """`parameter_ranks` of a function of `source` (a module-level one or a method; not a nested one,
    `outer` being its enclosing function), where the project is known."""
    if source.project is None or outer is not None:
        return {}
    target = Target(source.path, f"{cls.name}.{func.name}" if cls is not None else func.name)
    return parameter_ranks(source.project, target, func)


def bind(names: RankNames, passed: dict[str, PassedRank]) -> None:
    """Read the parameters in a function's names as what the project's calls pass (a parameter the body
    binds again keeps its bindings' reading)."""
    for name, found in passed.items():
        if name in names.assigned:
            continue
        names.values[name] = found.role
        if found.never_none:
            names.present.add(name)
