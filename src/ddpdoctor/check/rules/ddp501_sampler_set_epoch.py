from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..epoch_calls import once_before_epochs, set_epoch_calls
from ..epoch_loaders import EpochLoaders, cycled_parameters, iterated_loader, picks_loader, spans
from ..guards import branch_calls
from ..project import ModuleSummary, Target, show_chain, shuffling_sampler
from ..registry import Rule, register
from ..samplers import sampler_shuffles
from ..source import SourceFile, keyword, statements


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
    - out of a builder in any module, alone or in a tuple or dict: `loader, sampler = build(cfg)`, also
      through builders that return another builder's result (`return make_loaders(...)`, or `loader =
      make_loader(...)` then `return loader`); a loader made with `DataLoader(ds, **loader_args)` where
      `loader_args = {"sampler": sampler, ...}` holds the sampler counts as made with it;
    - in through a parameter: `def fit(model, train_loader)` where a caller, in any file, passes what a
      builder returned (`train_loader, val_loader = build(cfg)`, then `fit(model, train_loader)`), in a
      dict or list (`fit(loaders={"train": train_loader})`, or a name bound once to one), or passes its
      own parameter or a part of it that its callers fill so, at any depth (`build_pipeline(loaders)`
      calling `Pipeline(train=loaders["train"])`, through `train: DataLoader = loaders["train"]` too); a
      class picked from a registry dict (`PIPELINES = {"train": TrainingPipeline}`, in any file, then
      `PIPELINES[kind](...)`) is constructed by that call;
    - into a helper that loops over it, in any module, at any depth: `for epoch in ...:
      train_one_epoch(model, loaders)` where the helper (or a function it passes the argument to) walks
      `loaders["train"]` is reported at the call (`` `train_one_epoch()` (engine.py:1) → `for … in
      loaders['train']` (engine.py:3) ``); a loop over a project wrapper that returns its argument
      (`for batch in progress(loader):`, `return tqdm(it)` or `return it`) is a loop over the loader;
    - into a method: `for epoch in ...: self.train_epoch()` where the method (or a method it calls on
      `self`) walks `self.loader`; `trainer = Trainer(model, loader)` then `trainer.train_epoch()` in the
      epoch loop, where the constructor keeps the loader on `self`;
    - into a trainer class whose own epoch loop walks it: `Trainer(model, loaders).run()` where
      `__init__` keeps `loaders` and `run()`'s `while True:` calls a method that loops over
      `self.loaders["train"]` — reported at the sampler, with the chain into the class; when the loader
      is what a builder returned (`loader = create_loader(...)`, then `Pipeline(model, loader)`, any
      files), in the class's file at the call in its epoch loop, where `set_epoch` belongs (the
      constructor's callers fill `self.loader` as they fill a function's parameter);

    For the flows that leave the file the rule stays silent when any file of the program calls
    `set_epoch` (a helper may call `loader.sampler.set_epoch(epoch)`).

    Where the flow is lost — a loader handed to a library (`distribute(...)`), one element of a dict
    passed on alone (`run_loader(loaders[name])`), an object made by a factory — the rule falls back to
    the sampler: a `DistributedSampler` that shuffles (`shuffle` left to its default, True) in a training
    program (files linked by imports, one of which calls `.backward(`) where nothing calls `set_epoch` is
    reported at the sampler, worded as a guess (a sampler inside a loader builder that another file calls
    is left to that file). Programs that use Lightning, accelerate, ignite or a Hugging Face `Trainer` are
    left alone: their loops call `set_epoch` on the loader's sampler themselves.

    A `set_epoch` that runs once, before the epochs, is no better than none: where every `set_epoch` call
    of the file sits in no loop, in a function that is no event handler, above a later statement of the
    same function that runs the epochs (a loop whose own words say epoch: `for epoch in range(...)`,
    `while state.epoch < n`; or a library's epoch loop: `engine.run(loader, max_epochs=n)`), and no other
    file of the program calls `set_epoch`, the call is reported. An ignite handler registered with
    `@trainer.on(Events.EPOCH_STARTED)` runs at every epoch and is not.

    Limits: a `set_epoch` call anywhere in the file (or, for helpers and the fallback, in the program)
    silences the rest of the rule, whichever sampler it is on. `shuffle=False` samplers are never
    reported. A dict of
    loaders filled or read with computed keys (`{p: DataLoader(...) for p in phases}`, `loaders[name] =
    DataLoader(**params)` after `params["sampler"] = DistributedSampler(...)`, `for b in loaders[phase]`,
    `for name, loader in loaders.items()`) is followed as "any key of the dict" (`loaders[*]` in the
    message); a loop whose variable is that key (`for phase in loaders:`) picks a loader and is not an
    epoch loop. A loop over a loader that no outer loop repeats (one pass) is not an epoch loop; methods
    inherited from a class of another file are not searched for the epoch loop.

    ## Why is this bad?
    `DistributedSampler` shuffles with a seed derived from its epoch number, which only changes when you
    call `sampler.set_epoch(epoch)`. Without it every epoch visits the data in the same order, which
    quietly hurts convergence. Lightning and accelerate call it for you; a hand-written loop must.

    ## Known problems
    `shuffle` is followed through names, parameters (the calls of the same file) and `self.x` (every
    binding in the methods of its class in the same file); one read from configuration, or from a base
    class in another file, is unknown and taken to shuffle, the finding hedged. A `set_epoch` anywhere in the
    program is taken to be on the right sampler. Loaders passed through containers of containers are not
    followed. A sampler class called through a name (`S = RandomSampler if c else DistributedSampler`,
    `functools.partial(DistributedSampler, ...)`) is a call of each class it may be, the side a distributed
    run takes where the test says; arguments bound by `partial` are not read (its `shuffle` is the call's).
    A parameter is followed one call deep from the caller that bound the builder's result (not through a
    chain of parameters). A function that walks a loader it is given again on every pass of a loop
    (`while True: yield from loader`, `it = iter(loader)` once the last pass is exhausted) is reported,
    hedged, only where the parameter is annotated as a data loader (`loader: DataLoader`) and its program
    builds a DistributedSampler and calls `set_epoch` nowhere: which loader its callers pass is not
    followed. Folders a script adds to `sys.path` at run time are
    evaluated where the source spells them (`sys.path.insert(0, os.path.join(os.path.dirname(__file__),
    "..", "lib"))`, in the script or in a helper it imports first such as `_init_paths`; and a `lib/` folder
    beside the script's), not where they come from the environment or the working directory: where the loop
    over a builder's loader is still lost, a `set_epoch` in a file whose unresolved imports may name the
    builder's program keeps the guess from being made.

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
    triggers = ("DistributedSampler", "set_epoch")

    project_wide = True

    @classmethod
    def wanted_in_project(cls, text: str) -> bool:
        return True  # the loader may come from a builder in another file (the index chose this file)

    def check(self, source: SourceFile) -> Iterator[Finding]:
        if set_epoch_calls(source):
            # Called somewhere: whether on the right sampler is beyond the checker; whether it runs per
            # epoch is not, when every call sits once above the loop that runs the epochs.
            yield from self._set_once(source)
            return
        found = list(self._epoch_loops(source)) or list(self._cycled_parameters(source))
        yield from found
        if not found:
            yield from self._unused_samplers(source)

    def _set_once(self, source: SourceFile) -> Iterator[Finding]:
        once = once_before_epochs(source)
        project = source.project
        if not once or (project is not None and source.path in project.modules and any(
                m.set_epoch for m in project.component(source.path) if m.path != source.path)):
            return  # another file's `set_epoch` may be the one the epochs run
        for call in once:
            epochs = call.epochs
            where = (f"`{source.segment(epochs.func)}(...)` at line {epochs.lineno} runs the epochs"
                     if isinstance(epochs, ast.Call) else f"the epoch loop at line {epochs.lineno}")
            yield self.finding(
                source, call.call,
                f"`set_epoch` runs once, before the epochs start ({where}), and never again: every epoch "
                "after the first repeats the same order",
                fix=Fix(message=(
                    "call `set_epoch(epoch)` at the start of every epoch: in an epoch-start handler "
                    "(ignite: `@trainer.on(Events.EPOCH_STARTED)`)" if call.by_library else
                    "move `set_epoch(epoch)` into the epoch loop, as its first statement")),
            )

    def _cycled_parameters(self, source: SourceFile) -> Iterator[Finding]:
        """A loader given as a parameter typed as one (`def cycle(loader: DataLoader)`) and walked again on
        every pass of a loop (`while True: yield from loader`, `it = iter(loader)` once it is exhausted), in
        a training program that builds a DistributedSampler and calls `set_epoch` nowhere: hedged, since
        which loader the callers pass is not followed."""
        program = _unsynced_training_program(source)
        if not program:
            return
        built = sorted(m.path for m in program if m.samplers)
        if not built:
            return
        for function, name, annotation, outer, again in cycled_parameters(source):
            where = "this file" if built == [source.path] else f"`{os.path.basename(built[0])}`"
            yield self.finding(
                source, again,
                f"`{name}` (a `{annotation}` parameter of `{function}()`) is walked again on every pass of "
                f"the loop at line {outer.lineno}, and `set_epoch` is called nowhere in this program, which "
                f"builds a DistributedSampler ({where}): if the loader given uses it, every pass repeats "
                "the same order (the callers' loader was not followed, so this is a guess)",
                fix=Fix(message="call `loader.sampler.set_epoch(epoch)` before each pass over the loader"),
                facts={"hedged": True},
            )

    def _epoch_loops(self, source: SourceFile) -> Iterator[Finding]:
        loaders = EpochLoaders(source)
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
                    name := iterated_loader(inner.iter, loaders.paths)
                ) and not picks_loader(outer, inner):
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
        program = _unsynced_training_program(source)
        if project is None or not program:
            return
        paths = {m.path for m in program}
        if any(m.set_epoch and m.maybe_imports & paths
               for m in project.modules.values() if m.path not in paths):
            return  # a file that calls `set_epoch` may import this program through a `sys.path` addition
        # A builder's sampler is left to its callers when another file calls it, or when this file's loop
        # over what it returns was found (and is no epoch loop, or it would have been reported).
        loaders = EpochLoaders(source)
        walked = {
            loaders.built[name][0].line
            for loop in statements(source.tree.body)
            if isinstance(loop, (ast.For, ast.AsyncFor))
            and (name := iterated_loader(loop.iter, loaders.paths))
            and name in loaders.built
            and loaders.built[name][0].path == source.path
        }
        functions = project.modules[source.path].functions.values()
        builders = {f.line for f in functions
                    if f.returns_loader is not None and (f.line in walked or any(project.called(
                        Target(source.path, g.name), elsewhere=True) for g in functions
                        if g is f or g.forwards == Target(source.path, f.name)))}
        for call in source.calls:
            if not shuffling_sampler(call, source):
                continue
            if any(line <= call.lineno <= f_end for line, f_end in spans(source, builders)):
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


def _unsynced_training_program(source: SourceFile) -> list[ModuleSummary]:
    """The modules of the file's program (linked by imports) when it trains (`.backward(`), is not driven by
    a framework that calls `set_epoch` itself, and calls `set_epoch` nowhere; else none."""
    project = source.project
    if project is None or source.path not in project.modules:
        return []
    program = list(project.component(source.path))
    if any(m.set_epoch or m.framework for m in program) or not any(m.trains for m in program):
        return []
    return program
