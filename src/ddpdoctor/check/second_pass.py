"""Which files the second pass reads again: a file's findings that other files can change (a helper of
another module issuing a collective or writing a checkpoint, a loader built elsewhere, a rank read through
another file's helper...). Only these files are checked again with the whole project index."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from .facts import CallSite, Step, Target
from .rank_parameters import passed_into
from .reached_collectives import has_rank_only_callers

if TYPE_CHECKING:
    from .project import ProjectIndex


def needs_project(index: ProjectIndex, path: str) -> bool:
    """Whether a file's findings can change with the other files known: it calls into another module
    whose function issues a collective, writes a checkpoint or iterates an argument; it builds a
    DistributedSampler without calling `set_epoch`; or it makes collectives and is initialised
    elsewhere. Only these files are checked again with the whole index."""
    module = index.modules.get(path)
    if module is None:
        return False
    if module.samplers and not module.set_epoch:
        return True
    if module.trains and not module.set_epoch and any(m.loader_attributes for m in index.component(path)):
        return True  # DDP501: a loader kept on an attribute in another file, iterated here
    if module.manual_ddp and not module.shards and any(m.shards for m in index.component(path)):
        return True  # DDP502: the dataset may be split between the ranks in another file
    if module.asks_program and not module.launched and any(m.launched or m.makes_group
                                                           for m in index.component(path)):
        return True  # a helper module of a distributed program (program.program_is_distributed)
    if index.any_returned() and any(site.target.path != path or module.stars
                                  or _through_elsewhere(index, site.target)
                                  for f in module.functions.values() for site in f.calls
                                  if index.returned(site.target)):
        return True  # a rank read through a helper of another file (`rank, ws = get_dist_info()`)
    sites = [site for f in module.functions.values() for site in f.calls]
    if any(site.target.path != path and index.returns_wrapper(site.target) for site in sites):
        return True  # DDP104: `model = wrap(model)`, a helper of another file returning the wrapper
    if module.manual_ddp and not module.keeps_buffers and any(
            m.keeps_buffers for m in index.component(path)):
        return True  # DDP104: a DDP forward, the modules with buffers defined in another file
    if any(site.guarded and site.target.path != path and (found := index.function(site.target)) is not None
           and (found[1].runs_params or any(s.flows for s in found[1].calls)) for site in sites) and (
            module.manual_ddp or any(index.returns_wrapper(site.target) for site in sites)):
        return True  # DDP104: `evaluate(model)` under a rank test, the forward in another file
    if index.built_by_managed(path):
        return True  # DDP402: a constructor that a LightningModule of another file runs
    if index.has_metric_classes and _uses_metric_class(index, path, module.imports, sites):
        return True  # DDP101: a torchmetrics subclass of another file, computed here
    if (module.manual_ddp or module.collectives) and passed_into(index, path):
        return True  # `save(state, path, local_rank=rank)`: a parameter read as what its calls pass
    if index.tests_rank_attribute(path):
        return True  # `if index.device_id <= 0:` where a caller elsewhere passes the rank kept there
        # (or `if distr.is_global_main:`, a property returning a rank test)
    if index.has_builders() and any(index.returns_loader(site.target) for f in module.functions.values()
                                    for site in f.calls):
        return True  # `loader = build_loader(...)`: DDP501 follows it
    if index.has_builders() and any(index.loader_parameters(Target(path, name))
                                    for name in module.functions):
        return True  # `fit(model, build_loader(...))` in another file: DDP501 follows the parameter
    if module.manual_ddp and any(
            made.name[:1].isupper() and caller.path != path
            for name in module.functions for caller, site in index.callers(Target(path, name))
            for _, made, _ in site.results):
        return True  # DDP601: an object of a project class passed in from another file (`h.save(...)`)
    if (module.manual_ddp or module.lightning_processes or any(
            m.launched for m in index.component(path))) and any(
            f.save is not None or any(not s.guarded and index.saves(s.target) for s in f.calls)
            for f in module.functions.values()):
        return True  # DDP601: a module of a distributed program that writes checkpoints
    if module.framework and module.trains and any(
            f.save is not None and any(caller.path != path for caller, _ in index.callers(Target(path, name)))
            for name, f in module.functions.items()):
        return True  # DDP601: a library method that trains under accelerate itself, called from a script
    if module.collectives and not module.inits and any(m.inits for m in index.component(path)):
        return True
    methods = {name.rpartition(".")[2] for name in module.functions if "." in name}
    if "forward" in methods and not module.pipeline and any(m.pipeline for m in index.component(path)):
        return True  # DDP301: a stage of a DeepSpeed pipeline built in another file (pipeline_stages.py)
    if methods & {hook for m in index.component(path) if m.path != path for hook in m.delegated_hooks}:
        return True  # DDP103: a LightningModule of another file hands its hook to this method
    if module.collectives and any(_leaves(path, site.target, ()) and index.returns_cpu(site.target)
                                  for f in module.functions.values() for site in f.calls):
        return True  # DDP301: a tensor made on the CPU in another file
    if index.any_tensor_takers() and any(_leaves(path, site.target, ()) and index.takes_tensors(site.target)
                                for f in module.functions.values() for site in f.calls) and any(
            m.inits for m in index.component(path)):
        return True  # DDP301: a CPU tensor may be passed to a collective in another file
    for function in module.functions.values():
        for site in function.calls:
            if site.guarded and _leaves(path, site.target, index.collective(site.target)):
                return True  # DDP101
            if module.manual_ddp and not site.guarded and _leaves(path, site.target,
                                                                       index.saves(site.target)):
                return True  # DDP601
    # DDP101: a collective of this file that a call under a rank test in another file reaches
    return has_rank_only_callers(index, path)


def _leaves(path: str, target: Target, chain: tuple[Step, ...] | None) -> bool:
    """A chain that the first pass, knowing only this file, could not have followed."""
    if chain is None:
        return False
    return target.path != path or "." in target.name or any(step.path != path for step in chain)


def _through_elsewhere(index: ProjectIndex, target: Target) -> bool:
    """A function of the file that returns what a function of another file returns (`return is_main()`)."""
    found = index.function(target)
    through = found[1].returned.through if found is not None and found[1].returned is not None else None
    return through is not None and through.path != target.path


def _uses_metric_class(index: ProjectIndex, path: str, imports: frozenset[str],
                       sites: list[CallSite]) -> bool:
    """A file that calls a torchmetrics subclass of another file, or imports a module defining one (or a
    package importing such a module: a re-export). Not every file of the import component: in a package
    where one module defines a metric, that made nearly every file of torch + Lightning a second-pass file."""
    names, holders = _metric_classes(index)
    return any(site.target.path != path and site.target.name in names for site in sites) or any(
        p != path and p in holders for p in imports)


@lru_cache(maxsize=4)
def _metric_classes(index: ProjectIndex) -> tuple[frozenset[str], frozenset[str]]:
    """The run's class names deriving from a torchmetrics class (directly or through project bases), and the
    files defining one or importing a file that does."""
    names = frozenset(cls for m in index.modules.values() for cls in (
        *m.metric_classes, *(n.removesuffix(".__bases__") for n in m.functions if n.endswith(".__bases__")))
        if index.metric_class(Target(m.path, cls)))
    defining = {m.path for m in index.modules.values() if any(
        n.removesuffix(".__bases__") in names for n in (*m.metric_classes, *m.functions))}
    return names, frozenset(defining | {m.path for m in index.modules.values() if m.imports & defining})
