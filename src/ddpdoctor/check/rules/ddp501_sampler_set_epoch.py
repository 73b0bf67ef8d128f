from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..registry import Rule, register
from ..source import SourceFile, call_name, dotted, keyword, statements


@register
class SamplerWithoutSetEpoch(Rule):
    """
    ## What it does
    Finds a manual epoch loop (a loop around a loop over a data loader) whose loader uses a
    `DistributedSampler`, in a file that never calls `set_epoch` (mentions in comments and strings do not count).

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

    def check(self, source: SourceFile) -> Iterator[Finding]:
        if "set_epoch" in source.text and any(
                isinstance(c.func, ast.Attribute) and c.func.attr == "set_epoch" for c in source.calls):
            return  # called somewhere: whether on the right sampler is beyond a file-local check
        samplers: set[str] = set()
        loaders: dict[str, int] = {}
        assigns = [s for s in statements(source.tree.body) if isinstance(s, ast.Assign)]
        for stmt in assigns:
            if isinstance(stmt.value, ast.Call) and call_name(stmt.value) == "DistributedSampler":
                samplers.update(n for t in stmt.targets if (n := dotted(t)))
        for stmt in assigns:
            value = stmt.value
            if isinstance(value, ast.Call) and call_name(value).endswith("DataLoader"):
                sampler = keyword(value, "sampler")
                if sampler is None:
                    continue
                given = sampler.value
                if (isinstance(given, ast.Call) and call_name(given) == "DistributedSampler") or (
                        dotted(given) in samplers):
                    loaders.update((n, stmt.lineno) for t in stmt.targets if (n := dotted(t)))
        if not loaders:
            return
        for outer in statements(source.tree.body):
            if not isinstance(outer, (ast.For, ast.While)):
                continue
            for inner in statements(outer.body):
                if isinstance(inner, (ast.For, ast.AsyncFor)) and (name := _iterated_loader(inner.iter, loaders)):
                    yield self.finding(
                        source, inner,
                        f"`{name}` (line {loaders[name]}) uses a DistributedSampler, but `set_epoch` is never "
                        f"called: every epoch of the loop at line {outer.lineno} sees the same order",
                        fix=Fix(message="call `sampler.set_epoch(epoch)` at the start of every epoch"),
                    )


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
