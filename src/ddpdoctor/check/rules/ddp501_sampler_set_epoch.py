from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..guards import branch_calls
from ..project import ProjectIndex, Resolver, Step, Target, show_chain, shuffling_sampler
from ..registry import Rule, register
from ..source import SourceFile, call_name, dotted, keyword, statements


@register
class SamplerWithoutSetEpoch(Rule):
    """
    ## What it does
    Finds a manual epoch loop (a loop around a loop over a data loader) whose loader uses a shuffling
    `DistributedSampler`, in a file that never calls `set_epoch` (mentions in comments and strings do not
    count). The batch loop may be in a helper, in any module: `for epoch in ...: train_one_epoch(model,
    loader)` where `train_one_epoch` (or a function it passes the loader to) loops over that argument is
    reported at the call, with the chain (`` `train_one_epoch()` (engine.py:1) → `for … in loader`
    (engine.py:2) ``), unless some file of the program calls `set_epoch` (a helper may call
    `loader.sampler.set_epoch(epoch)`).

    Where the flow is lost — the loader kept in a dict, returned in a tuple, handed to a trainer class
    whose `while True` loop draws from it — the rule falls back to the sampler: a `DistributedSampler`
    that shuffles (`shuffle` left to its default, True) in a training program (files linked by imports,
    one of which calls `.backward(`) where nothing calls `set_epoch` is reported at the sampler, worded as
    a guess. Programs that use Lightning, accelerate, ignite or a Hugging Face `Trainer` are left alone:
    their loops call `set_epoch` on the loader's sampler themselves.

    Limits: a `set_epoch` call anywhere in the file (or, for helpers and the fallback, in the program)
    silences the rule, whichever sampler it is on. `shuffle=False` samplers are never reported. A
    sampler inside a loader builder that some function calls is left to the builder's callers.

    ## Why is this bad?
    `DistributedSampler` shuffles with a seed derived from its epoch number, which only changes when you
    call `sampler.set_epoch(epoch)`. Without it every epoch visits the data in the same order, which
    quietly hurts convergence. Lightning and accelerate call it for you; a hand-written loop must.

    ## Example
    ```python
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, sampler=sampler, batch_size=32)
    for epoch in range(epochs):
        for batch in loader:
            train_step(batch)
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            train_step(batch)
    ```

    ## Fix safety
    No automatic fix: the sampler may not be reachable by name at the top of the epoch loop.

    ## References
    - <https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler>
    - <https://github.com/pytorch/pytorch/issues/31771>
    """

    code = "DDP501"
    name = "sampler-without-set-epoch"
    class_slug = "sampler-epoch"
    severity = Severity.WARNING
    summary = "a manual epoch loop over a DistributedSampler loader with no `set_epoch`"
    triggers = ("DistributedSampler",)

    project_wide = True

    @classmethod
    def wanted_in_project(cls, text: str) -> bool:
        return True  # the loader may come from a builder in another file (the index chose this file)

    def check(self, source: SourceFile) -> Iterator[Finding]:
        has_set_epoch = "set_epoch" in source.text and any(
            isinstance(c.func, ast.Attribute) and c.func.attr == "set_epoch" for c in source.calls)
        if has_set_epoch:
            return  # called somewhere: whether on the right sampler is beyond the checker
        found = list(self._epoch_loops(source))
        yield from found
        if not found:
            yield from self._unused_samplers(source)

    def _epoch_loops(self, source: SourceFile) -> Iterator[Finding]:
        samplers: set[str] = set()
        loaders: dict[str, int] = {}
        assigns = [s for s in statements(source.tree.body) if isinstance(s, ast.Assign)]
        for stmt in assigns:
            if isinstance(stmt.value, ast.Call) and shuffling_sampler(stmt.value):
                samplers.update(n for t in stmt.targets if (n := dotted(t)))
        for stmt in assigns:
            value = stmt.value
            if isinstance(value, ast.Call) and call_name(value).endswith("DataLoader"):
                sampler = keyword(value, "sampler")
                if sampler is None:
                    continue
                given = sampler.value
                if (isinstance(given, ast.Call) and shuffling_sampler(given)) or dotted(given) in samplers:
                    loaders.update((n, stmt.lineno) for t in stmt.targets if (n := dotted(t)))
        project = source.project
        resolver = project.resolver(source) if project is not None else None
        built: dict[str, tuple[Step, ...]] = {}
        if resolver is not None and project is not None and not any(
                m.set_epoch for m in project.component(source.path)):
            for stmt in assigns:  # `loader = build_loader(...)`, the builder in any module
                if isinstance(stmt.value, ast.Call) and (builder := resolver.callee(stmt.value.func, None)):
                    made = project.returns_loader(builder[0])
                    if made is not None:
                        for bound in stmt.targets:
                            if loader_name := dotted(bound):
                                loaders[loader_name] = stmt.lineno
                                built[loader_name] = made
        if not loaders:
            return
        reported: set[int] = set()
        for outer in statements(source.tree.body):
            if not isinstance(outer, (ast.For, ast.While)) or id(outer) in reported:
                continue
            for inner in statements(outer.body):
                if isinstance(inner, (ast.For, ast.AsyncFor)) and (name := _iterated_loader(inner.iter, loaders)):
                    reported.update(id(s) for s in statements(outer.body) if isinstance(s, (ast.For, ast.While)))
                    origin = f", built by {show_chain(built[name])}" if name in built else ""
                    yield self.finding(
                        source, inner,
                        f"`{name}` (line {loaders[name]}{origin}) uses a DistributedSampler, but `set_epoch` is "
                        f"never called: every epoch of the loop at line {outer.lineno} sees the same order",
                        fix=Fix(message="call `sampler.set_epoch(epoch)` at the start of every epoch"),
                    )
            if resolver is None or project is None or id(outer) in reported or any(
                    m.set_epoch for m in project.component(source.path)):
                continue  # (a helper elsewhere may call `loader.sampler.set_epoch(epoch)`)
            for call in branch_calls(outer.body):
                chain = _helper_iterating(call, loaders, resolver, project)
                if chain is None:
                    continue
                name, steps = chain
                origin = f", built by {show_chain(built[name])}" if name in built else ""
                reported.update(id(s) for s in statements(outer.body) if isinstance(s, (ast.For, ast.While)))
                yield self.finding(
                    source, call,
                    f"`{name}` (line {loaders[name]}{origin}) uses a DistributedSampler, but `set_epoch` is "
                    f"never called: every epoch of the loop at line {outer.lineno} sees the same order "
                    f"(the batches are drawn in {show_chain(steps)})",
                    fix=Fix(message="call `sampler.set_epoch(epoch)` at the start of every epoch"),
                    facts={"via": " → ".join(step.show() for step in steps)},
                )
                break

    def _unused_samplers(self, source: SourceFile) -> Iterator[Finding]:
        """Where the flow is lost (a loader in a dict, returned by a builder, iterated in a class): a shuffling
        DistributedSampler built here, in a training program that calls `set_epoch` nowhere."""
        project = source.project
        if project is None or source.path not in project.modules:
            return
        program = project.component(source.path)
        if any(m.set_epoch or m.framework for m in program) or not any(m.trains for m in program):
            return
        builders = {f.line for f in project.modules[source.path].functions.values()
                    if f.returns_loader is not None and project.called(Target(source.path, f.name))}
        for call in source.calls:
            if not shuffling_sampler(call):
                continue
            if any(line <= call.lineno <= f_end for line, f_end in _spans(source, builders)):
                continue  # in a loader builder that is called: the loop is looked for at its callers
            files = len(program)
            scope = "this file" if files == 1 else f"this program ({files} files connected by imports)"
            yield self.finding(
                source, call,
                "this DistributedSampler shuffles (`shuffle` defaults to True), but `set_epoch` is called "
                f"nowhere in {scope}: unless something else calls it, every epoch sees the same order "
                "(the loop over its loader was not followed, so this is a guess)",
                fix=Fix(message="call `sampler.set_epoch(epoch)` at the start of every epoch"),
                facts={"hedged": True},
            )


def _spans(source: SourceFile, starts: set[int]) -> list[tuple[int, int]]:
    return [(node.lineno, node.end_lineno or node.lineno) for node in statements(source.tree.body)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno in starts]


def _helper_iterating(call: ast.Call, loaders: dict[str, int], resolver: Resolver, project: ProjectIndex
                      ) -> tuple[str, tuple[Step, ...]] | None:
    """`train(model, loader)` where `train` (in any module) loops over that argument, at any depth."""
    arguments: list[tuple[int | str, ast.expr]] = [*enumerate(call.args)]
    arguments += [(kw.arg, kw.value) for kw in call.keywords if kw.arg]
    candidates = [(where, name) for where, arg in arguments if (name := dotted(arg)) in loaders]
    if not candidates:
        return None
    found = resolver.callee(call.func, None)
    if found is None:
        return None
    target, bound = found
    for where, name in candidates:
        steps = project.iterates(target, where, bound)
        if steps is not None:
            return name, steps
    return None


def _iterated_loader(node: ast.expr, loaders: dict[str, int]) -> str | None:
    """`loader`, `enumerate(loader)`, `tqdm(loader, ...)`, `zip(loader, ...)`."""
    name = dotted(node)
    if name in loaders:
        return name
    if isinstance(node, ast.Call):
        for arg in node.args[:2]:
            found = _iterated_loader(arg, loaders)
            if found:
                return found
    return None
