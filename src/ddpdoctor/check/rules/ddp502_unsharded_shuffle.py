from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..eval_loaders import evaluation_only
from ..registry import Rule, register
from ..sharding import sharded
from ..source import SourceFile, call_name, keyword, last_name


@register
class ShuffledLoaderWithoutSampler(Rule):
    """
    ## What it does
    Finds `DataLoader(..., shuffle=True)` without a `sampler`/`batch_sampler` in a hand-written DDP script
    (one that calls `init_process_group` or wraps a model in `DistributedDataParallel`, without Lightning or
    accelerate preparing its loaders). The class is torch's `DataLoader` or a class of the file deriving
    from a `...DataLoader`; a class of the file deriving from none (a combinator that shuffles the order of
    whole batches drawn from sharded loaders) or one a project module exports is not a loader here.

    A dataset split between the ranks before the loader reads it needs no sampler: one bound to
    `dataset.shard(num_shards, index)` or `split_dataset_by_node(...)` (Hugging Face `datasets`) in the
    same function, or one that comes from outside the function (a parameter, `self.dataset`) in a program
    some file of which shards a dataset that way (`dataset = dataset.shard(dist.get_world_size(), rank)`
    in `__main__.py`, then `Trainer(dataset)` whose loop makes `DataLoader(self.dataset, shuffle=True)`).

    A loader that only feeds evaluation is not reported: its name is walked only in functions that call
    `model.eval()` or run under `torch.no_grad()`/`inference_mode()` and call no `.backward()` or `.step()`
    (every rank scores the whole set: redundant work, the same result).

    ## Why is this bad?
    A plain shuffled loader gives every rank the whole dataset, in its own random order. With N ranks each
    "epoch" is N epochs of work, ranks train on overlapping batches, and the per-rank learning-rate and
    batch-size arithmetic is off by a factor of N. Nothing fails. Lightning and accelerate replace the
    sampler for you; a manual DDP loop needs a `DistributedSampler`.

    ## Known problems
    An evaluation loader passed to another function, returned or kept on an object is reported like a
    training one.

    A hand-written DDP script is recognised by its own `init_process_group` or
    `DistributedDataParallel`, called (a single-process baseline that only imports them, beside its
    distributed sibling, is not one, unless a file of its program makes the group); a loader built in a
    helper module of such a script is not checked. Sharding
    in another file is matched to the program, not to the dataset object: a program that shards one dataset
    and not another is taken as sharding both.

    ## Example
    ```python
    dist.init_process_group("nccl")
    model = DistributedDataParallel(model, device_ids=[local_rank])
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    ```

    ## Use instead
    ```python
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    ```
    (and call `sampler.set_epoch(epoch)` every epoch).

    ## Fix safety
    No automatic fix: the sampler changes the epoch length and needs `set_epoch` calls.

    ## References
    - <https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler>
    - <https://pytorch.org/tutorials/intermediate/ddp_tutorial.html>
    - <https://github.com/pytorch/pytorch/issues/11324>
    """

    code = "DDP502"
    name = "shuffled-loader-without-sampler"
    class_slug = "sampler-epoch"
    severity = Severity.WARNING
    summary = "a shuffled DataLoader without a DistributedSampler in a manual DDP script"
    triggers = ("shuffle",)
    project_wide = True  # the dataset may be sharded in another file of the program

    def check(self, source: SourceFile) -> Iterator[Finding]:
        if not source.manual_ddp or not _uses_ddp(source):
            return
        for call in source.calls:
            if not call_name(call).endswith("DataLoader"):
                continue
            qual = source.resolve(call.func) or ""
            if qual and not qual.startswith("torch.utils.data") or not qual and _project_class(source, call):
                continue
            shuffle = keyword(call, "shuffle")
            if shuffle is None or not (
                isinstance(shuffle.value, ast.Constant) and shuffle.value.value is True
            ):
                continue
            if keyword(call, "sampler") or keyword(call, "batch_sampler") or len(call.args) > 3:
                continue
            dataset = call.args[0] if call.args else next(
                (kw.value for kw in call.keywords if kw.arg == "dataset"), None)
            if dataset is not None and sharded(source, dataset):
                continue  # each rank reads its own part already
            if evaluation_only(source, call):
                continue  # every rank scores the whole set: redundant, not wrong
            yield self.finding(
                source, shuffle,
                "`shuffle=True` without a DistributedSampler in a DDP script: every rank iterates the whole "
                "dataset in its own order instead of its own shard",
                fix=Fix(message="use `sampler=DistributedSampler(dataset)` (and `set_epoch` every epoch)"),
            )


# What a DDP script does, not only imports: it makes the group, or wraps a model (torch's class, apex's, or
# the alias either is imported under).
_DDP_USES = ("init_process_group", "DistributedDataParallel")


def _uses_ddp(source: SourceFile) -> bool:
    """The file makes the process group or wraps a model itself, or a file of its program makes the group
    (`ProjectIndex.component`): a single-process baseline that only imports `torch.distributed` and a DDP
    class beside its distributed sibling is no DDP script. `model.module` alone (a wrapper made elsewhere)
    counts as use."""
    if any((source.resolve(call.func) or call_name(call)).endswith(_DDP_USES) for call in source.calls):
        return True
    if "init_process_group" not in source.text and "DistributedDataParallel" not in source.text:
        return True  # `ddp_model.module`: manual_ddp's evidence is the wrapper's use
    project = source.project
    return project is not None and source.path in project.modules and any(
        m.makes_group for m in project.component(source.path))


def _project_class(source: SourceFile, call: ast.Call) -> bool:
    """A class of the project that is no loader of torch's: one of this file that derives from no
    `...DataLoader` (metatrain's `CombinedDataLoader` over loaders that each hold a `DistributedSampler`), or
    one a relative import brings in (a project class: an absolute import of one is not torch's either)."""
    if not isinstance(call.func, ast.Name):
        return False
    name = call.func.id
    if name in source.classes:
        return name not in source._subclasses(lambda base: last_name(base).endswith("DataLoader"))
    return any(isinstance(node, ast.ImportFrom) and node.level and any(
        (alias.asname or alias.name) == name for alias in node.names) for node in source.tree.body)
