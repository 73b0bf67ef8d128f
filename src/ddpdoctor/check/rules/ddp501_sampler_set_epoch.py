from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..flows import path_of, suffix_after
from ..guards import branch_calls
from ..project import (
    ProjectIndex,
    Resolver,
    Step,
    Target,
    bound_paths,
    held_loaders,
    show_chain,
    shuffling_sampler,
)
from ..registry import Rule, register
from ..samplers import sampler_shuffles
from ..source import SourceFile, call_name, keyword, statements


@register
class SamplerWithoutSetEpoch(Rule):
    """
    ## What it does
    Finds a manual epoch loop (a loop around a loop over a data loader) whose loader uses a shuffling
    `DistributedSampler`, in a file that never calls `set_epoch` (mentions in comments and strings do not
    count). The sampler may be passed directly, by name or attribute (`self.sampler`), or through a
    conditional (`DistributedSampler(ds) if distributed else None`).

    The loader is followed where it is kept and where it goes, with the chain in the message:

    - in a dict or an attribute: `loaders["train"] = DataLoader(...)`, `{"train": DataLoader(...)}`,
      `self.train_loader = DataLoader(...)`;
    - out of a builder in any module, alone or in a tuple or dict: `loader, sampler = build(cfg)`;
    - into a helper that loops over it, in any module, at any depth: `for epoch in ...:
      train_one_epoch(model, loaders)` where the helper (or a function it passes the argument to) walks
      `loaders["train"]` is reported at the call (`` `train_one_epoch()` (engine.py:1) → `for … in
      loaders['train']` (engine.py:3) ``);
    - into a method: `for epoch in ...: self.train_epoch()` where the method (or a method it calls on
      `self`) walks `self.loader`; `trainer = Trainer(model, loader)` then `trainer.train_epoch()` in the
      epoch loop, where the constructor keeps the loader on `self`;
    - into a trainer class whose own epoch loop walks it: `Trainer(model, loaders).run()` where
      `__init__` keeps `loaders` and `run()`'s `while True:` calls a method that loops over
      `self.loaders["train"]` — reported at the sampler, with the chain into the class.

    For the flows that leave the file the rule stays silent when any file of the program calls
    `set_epoch` (a helper may call `loader.sampler.set_epoch(epoch)`).

    Where the flow is lost — a loader handed to a library (`distribute(...)`), a computed key
    (`loaders[split]`), an object made by a factory — the rule falls back to the sampler: a
    `DistributedSampler` that shuffles (`shuffle` left to its default, True) in a training program (files
    linked by imports, one of which calls `.backward(`) where nothing calls `set_epoch` is reported at the
    sampler, worded as a guess (a sampler inside a loader builder that another file calls is left to that
    file). Programs that use Lightning, accelerate, ignite or a Hugging Face `Trainer` are left alone:
    their loops call `set_epoch` on the loader's sampler themselves.

    Limits: a `set_epoch` call anywhere in the file (or, for helpers and the fallback, in the program)
    silences the rule, whichever sampler it is on. `shuffle=False` samplers are never reported. Only
    constant keys and attributes are followed (`loaders["train"]`, not `loaders[split]`); a loop over a
    loader that no outer loop repeats (one pass) is not an epoch loop; methods inherited from a class of
    another file are not searched for the epoch loop.

    ## Why is this bad?
    `DistributedSampler` shuffles with a seed derived from its epoch number, which only changes when you
    call `sampler.set_epoch(epoch)`. Without it every epoch visits the data in the same order, which
    quietly hurts convergence. Lightning and accelerate call it for you; a hand-written loop must.

    ## Known problems
    `shuffle` is followed through names and parameters (the calls of the same file); one read from
    configuration is unknown and taken to shuffle, the finding hedged. A `set_epoch` anywhere in the
    program is taken to be on the right sampler. Loaders passed through containers of containers, or chosen
    through a class alias (`S = RandomSampler if c else DistributedSampler`), are not followed.

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
        loaders = _Loaders(source)
        if not loaders.paths:
            return
        project, resolver = source.project, loaders.resolver
        follow = project is not None and resolver is not None and not loaders.program_set_epoch
        classes = [(node.lineno, node.end_lineno or node.lineno, node.name) for node in source.tree.body
                   if isinstance(node, ast.ClassDef)]
        reported: set[int] = set()
        for outer in statements(source.tree.body):
            if not isinstance(outer, (ast.For, ast.While)) or id(outer) in reported:
                continue
            for inner in statements(outer.body):
                if isinstance(inner, (ast.For, ast.AsyncFor)) and (
                    name := _iterated_loader(inner.iter, loaders.paths)
                ):
                    reported.update(
                        id(s) for s in statements(outer.body) if isinstance(s, (ast.For, ast.While))
                    )
                    yield self.finding(
                        source,
                        inner,
                        f"{loaders.describe(name)} uses a DistributedSampler, but `set_epoch` is never "
                        f"called: every epoch of the loop at line {outer.lineno} sees the same order",
                        fix=Fix(message="call `sampler.set_epoch(epoch)` at the start of every epoch"),
                    )
            if not follow or id(outer) in reported:
                continue  # (a helper elsewhere may call `loader.sampler.set_epoch(epoch)`)
            cls = next((name for start, end, name in classes if start <= outer.lineno <= end), None)
            for call in branch_calls(outer.body):
                chain = loaders.followed(call, cls)
                if chain is None:
                    continue
                name, steps = chain
                reported.update(id(s) for s in statements(outer.body) if isinstance(s, (ast.For, ast.While)))
                yield self.finding(
                    source,
                    call,
                    f"{loaders.describe(name)} uses a DistributedSampler, but `set_epoch` is never called: "
                    f"every epoch of the loop at line {outer.lineno} sees the same order (the batches are "
                    f"drawn in {show_chain(steps)})",
                    fix=Fix(message="call `sampler.set_epoch(epoch)` at the start of every epoch"),
                    facts={"via": " → ".join(step.show() for step in steps)},
                )
                break
        if not follow or reported:
            return
        # A loader handed to a project class whose own epoch loop walks it (`Trainer(loaders).run()`):
        # reported at the sampler, the one object that needs `set_epoch`, with the chain into the class.
        for call in source.calls:
            chain = loaders.constructed(call)
            if chain is None:
                continue
            name, steps = chain
            at = loaders.sampler_nodes.get(name, call)
            yield self.finding(
                source, at,
                f"{loaders.describe(name)} uses a DistributedSampler that shuffles, but `set_epoch` is never "
                f"called: every epoch sees the same order (the epochs are run by {show_chain(steps)})",
                fix=Fix(message="call `sampler.set_epoch(epoch)` at the start of every epoch"),
                facts={"via": " → ".join(step.show() for step in steps)},
            )
            return

    def _unused_samplers(self, source: SourceFile) -> Iterator[Finding]:
        """Where the flow is lost (a loader in a dict, returned by a builder, iterated in a class): a
        shuffling
        DistributedSampler built here, in a training program that calls `set_epoch` nowhere."""
        project = source.project
        if project is None or source.path not in project.modules:
            return
        program = project.component(source.path)
        if any(m.set_epoch or m.framework for m in program) or not any(m.trains for m in program):
            return
        # A builder's sampler is left to its callers when another file calls it, or when this file's loop
        # over what it returns was found (and is no epoch loop, or it would have been reported).
        loaders = _Loaders(source)
        walked = {
            loaders.built[name][0].line
            for loop in statements(source.tree.body)
            if isinstance(loop, (ast.For, ast.AsyncFor))
            and (name := _iterated_loader(loop.iter, loaders.paths))
            and name in loaders.built
            and loaders.built[name][0].path == source.path
        }
        builders = {f.line for f in project.modules[source.path].functions.values()
                    if f.returns_loader is not None and (f.line in walked or project.called(
                        Target(source.path, f.name), elsewhere=True))}
        for call in source.calls:
            if not shuffling_sampler(call, source):
                continue
            if any(line <= call.lineno <= f_end for line, f_end in _spans(source, builders)):
                continue  # in a loader builder that is called: the loop is looked for at its callers
            files = len(program)
            scope = "this file" if files == 1 else f"this program ({files} files connected by imports)"
            answer = sampler_shuffles(call, source)
            given = keyword(call, "shuffle")
            shuffles = f"shuffles {answer.hedge}" if answer.hedge else (
                "shuffles (`shuffle` defaults to True)" if given is None else
                f"shuffles (`shuffle={source.segment(given.value)}` is true where it is called)")
            yield self.finding(
                source, call,
                f"this DistributedSampler {shuffles}, but `set_epoch` is called "
                f"nowhere in {scope}: unless something else calls it, every epoch sees the same order "
                "(the loop over its loader was not followed, so this is a guess)",
                fix=Fix(message="call `sampler.set_epoch(epoch)` at the start of every epoch"),
                facts={"hedged": True},
            )


def _spans(source: SourceFile, starts: set[int]) -> list[tuple[int, int]]:
    return [(node.lineno, node.end_lineno or node.lineno) for node in statements(source.tree.body)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno in starts]


class _Loaders:
    """The loaders of a file that draw from a shuffling DistributedSampler, by access path (`loader`,
    `loaders['train']`, `self.train_loader`), with what made them, and the ways the index follows them."""

    def __init__(self, source: SourceFile):
        self.source = source
        project = source.project
        self.project = project
        self.resolver: Resolver | None = project.resolver(source) if project is not None else None
        self.program_set_epoch = project is not None and any(
            m.set_epoch for m in project.component(source.path)
        )
        self.paths: dict[str, int] = {}
        self.built: dict[str, tuple[Step, ...]] = {}
        self.sampler_nodes: dict[str, ast.AST] = {}
        self.objects: dict[str, tuple[Target, ast.Call]] = {}  # `trainer = Trainer(...)`: a project class
        samplers: dict[str, ast.AST] = {}
        assigns = [s for s in statements(source.tree.body) if isinstance(s, ast.Assign)]
        for stmt in assigns:
            if shuffling_sampler(stmt.value, source):
                samplers.update((p, stmt.value) for t in stmt.targets if (p := path_of(t)))
        for stmt in assigns:
            held = held_loaders(stmt.value, set(samplers), set(self.paths), source=source)
            if held:
                for target in stmt.targets:
                    for path in bound_paths(target, held):
                        self.paths.setdefault(path, stmt.lineno)
                        self._remember_sampler(path, stmt.value, held, samplers)
                continue
            if self.resolver is None or not isinstance(stmt.value, ast.Call):
                continue
            kind = self.resolver.class_of(stmt.value) if call_name(stmt.value)[:1].isupper() else None
            if kind is not None and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                self.objects[stmt.targets[0].id] = (kind, stmt.value)
            elif project is not None and not self.program_set_epoch and (
                    builder := self.resolver.callee(stmt.value.func, None)):
                made = project.returns_loader(builder[0])  # `loader = build_loader(...)`, in any module
                if made is not None:
                    chain, suffixes = made
                    for target in stmt.targets:
                        for path in bound_paths(target, suffixes):
                            self.paths.setdefault(path, stmt.lineno)
                            self.built[path] = chain
        if project is not None and not self.program_set_epoch:
            self._kept_elsewhere(project)
            self._passed_in(project)

    def _passed_in(self, project: ProjectIndex) -> None:
        """`def fit(model, train_loader)` where a caller, in any file, passes what a loader builder returned
        (`train_loader, val_loader = build(cfg)`, then `fit(model, train_loader)`)."""
        for node in statements(self.source.tree.body):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            cls = next((c.name for c in self.source.classes.values() if node in c.body), None)
            target = Target(self.source.path, f"{cls}.{node.name}" if cls else node.name)
            params = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
            for index, rest, chain in project.loader_parameters(target):
                if index < len(params) and (path := params[index] + rest) not in self.paths:
                    self.paths[path] = node.lineno
                    self.built[path] = chain

    def _kept_elsewhere(self, project: ProjectIndex) -> None:
        """`for batch in data.train_loader` where a file of the program keeps such a loader on an attribute
        of that name (`self.train_loader = DataLoader(..., sampler=DistributedSampler(...))`): attributes
        are joined over every assignment in the program, whatever object holds them."""
        kept = {attr: (module.path, line) for module in project.component(self.source.path)
                for attr, line in module.loader_attributes}
        if not kept:
            return
        for loop in statements(self.source.tree.body):
            if not isinstance(loop, (ast.For, ast.AsyncFor)):
                continue
            for node in (loop.iter, *(loop.iter.args[:2] if isinstance(loop.iter, ast.Call) else ())):
                if isinstance(node, ast.Attribute) and node.attr in kept and (path := path_of(node)):
                    where, line = kept[node.attr]
                    if path not in self.paths:
                        self.paths[path] = loop.lineno
                        self.built[path] = (Step(f"`.{node.attr} = DataLoader(…)`", where, line),)

    def _remember_sampler(
        self, path: str, value: ast.expr, held: list[str], samplers: dict[str, ast.AST]
    ) -> None:
        """The sampler of a loader made here (`DataLoader(..., sampler=s)`), for findings about it."""
        for node in ast.walk(value) if not isinstance(value, ast.Call) or held != [""] else (value,):
            if isinstance(node, ast.Call) and call_name(node).endswith("DataLoader"):
                given = keyword(node, "sampler")
                if given is None:
                    continue
                if isinstance(given.value, ast.Call):
                    self.sampler_nodes.setdefault(path, given.value)
                elif (name := path_of(given.value)) in samplers:
                    self.sampler_nodes.setdefault(path, samplers[name])
                return

    def describe(self, path: str) -> str:
        origin = f", built by {show_chain(self.built[path])}" if path in self.built else ""
        sampler = self.sampler_nodes.get(path)
        if isinstance(sampler, ast.Call) and (answer := sampler_shuffles(sampler, self.source)).hedge:
            origin += f"; its sampler shuffles {answer.hedge}"
        return f"`{path}` (line {self.paths[path]}{origin})"

    def _arguments(self, call: ast.Call) -> Iterator[tuple[int | str, str, str]]:
        """(argument, loader path, where the loader is in the argument) for each argument holding a loader."""
        arguments: list[tuple[int | str, ast.expr]] = [*enumerate(call.args)]
        arguments += [(kw.arg, kw.value) for kw in call.keywords if kw.arg]
        for where, arg in arguments:
            given = path_of(arg)
            if given is None:
                continue
            for path in self.paths:
                rest = suffix_after(path, given)
                if rest is not None:
                    yield where, path, rest

    def followed(self, call: ast.Call, cls: str | None) -> tuple[str, tuple[Step, ...]] | None:
        """A call in an epoch loop that draws batches from a loader: `train(model, loader)` (any module, any
        depth, a dict of loaders included) or `self.train_epoch()` iterating `self.loader`."""
        if self.resolver is None or self.project is None:
            return None
        found = self.resolver.callee(call.func, cls, {name: made for name, (made, _) in self.objects.items()})
        if found is None:
            return None
        target, bound = found
        for where, path, rest in self._arguments(call):
            steps = self.project.iterates(target, where, bound, rest)
            if steps is not None:
                return path, steps
        receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
        if bound and isinstance(receiver, ast.Name) and receiver.id in self.objects:
            made, construction = self.objects[receiver.id]
            for where, path, rest in self._arguments(construction):
                steps = self.project.object_iterates(target, where, rest)
                if steps is not None:
                    return path, (
                        Step(f"`{call_name(construction)}(…)`", self.source.path, construction.lineno),
                        *steps,
                    )
        if bound and isinstance(receiver, ast.Name) and receiver.id == "self":
            for path in self.paths:
                if path.startswith("self."):
                    steps = self.project.self_iterates(target, path[5:])
                    if steps is not None:
                        return path, (self.project.where(target), *steps)
        return None

    def constructed(self, call: ast.Call) -> tuple[str, tuple[Step, ...]] | None:
        """`Trainer(model, loaders)`: a project class given a loader, whose epoch loop walks it."""
        if self.resolver is None or self.project is None or not call_name(call)[:1].isupper():
            return None
        made = self.resolver.class_of(call)
        if made is None:
            return None
        for where, path, rest in self._arguments(call):
            steps = self.project.epoch_loop(made, where, rest)
            if steps is not None:
                here = Step(f"`{call_name(call)}(…)`", self.source.path, call.lineno)
                return path, (here, *steps)
        return None


def _iterated_loader(node: ast.expr, loaders: dict[str, int]) -> str | None:
    """`loader`, `loaders['train']`, `enumerate(loader)`, `tqdm(loader, ...)`, `zip(loader, ...)`."""
    name = path_of(node)
    if name in loaders:
        return name
    if isinstance(node, ast.Call):
        for arg in node.args[:2]:
            found = _iterated_loader(arg, loaders)
            if found:
                return found
    return None
