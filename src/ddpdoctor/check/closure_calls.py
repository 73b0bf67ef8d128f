"""A nested function passed to a project function runs where that function calls its parameter
(`save_if_main(write, path)` then `if is_main: fn(path)`): the call graph turns each such pass into a call,
once the index is whole (nested.py says where a nested function is defined and passed)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .constant_gates import parameter_index
from .facts import FunctionSummary, ModuleSummary, Target

if TYPE_CHECKING:
    from .callgraph import CallGraph


def closures_run(graph: CallGraph, module: ModuleSummary) -> ModuleSummary:
    """The module with each nested function it passes to a project function (`save_if_main(write,
    path)`) made a call of that nested function where the callee calls its parameter: under a rank test
    when every such call is under one (the passing call's own guard included). Passed to a function
    that never calls it, or one the index does not know, it is no call: where it runs is unknown."""
    functions = dict(module.functions)
    for name, summary in module.functions.items():
        if not summary.passes:
            continue
        runs = []
        for site in summary.passes:
            assert site.passed_to is not None
            guarded = calls_parameter(graph, *site.passed_to)
            if guarded is not None:
                runs.append(dataclasses.replace(site, guarded=site.guarded or guarded))
        functions[name] = dataclasses.replace(summary, calls=(*summary.calls, *runs), passes=())
    return dataclasses.replace(module, functions=functions, passes_closures=False)

def calls_parameter(graph: CallGraph, target: Target, argument: int | str, bound: bool) -> bool | None:
    """Whether `target` calls what it is given in `argument` (`fn(path)`), itself or through the project
    functions it passes it on to unchanged: False when some call runs outside any rank test, True when
    every one is under one (or in a `@rank_zero_only` function), None when none is known."""
    found = graph.function(target)
    index = parameter_index(found[1].params, argument, bound) if found is not None else None
    if found is None or index is None:
        return None
    answer: bool | None = None
    seen: set[tuple[Target, int, bool]] = set()
    queue: list[tuple[Target, FunctionSummary, int, bool]] = [(found[0], found[1], index, False)]
    while queue and len(seen) < 1_000:
        at, summary, index, under = queue.pop()
        if (at, index, under) in seen:
            continue
        seen.add((at, index, under))
        under = under or summary.rank_zero_only
        for param, guarded in summary.calls_params:
            if param == index:
                if not (under or guarded):
                    return False
                answer = True
        for site in summary.calls:
            for arg, caller_param in site.flows:
                callee = graph.function(site.target) if caller_param == index else None
                inner = parameter_index(callee[1].params, arg, site.bound) if callee is not None else None
                if callee is not None and inner is not None:
                    queue.append((callee[0], callee[1], inner, under or site.guarded))
    return answer
