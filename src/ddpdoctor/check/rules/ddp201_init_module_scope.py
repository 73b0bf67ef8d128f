from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..guards import branch_calls
from ..registry import Rule, register
from ..source import SourceFile, call_name, dotted, statements

RUN_METHODS = frozenset({"fit", "validate", "test", "predict"})
DATA_SUFFIXES = ("DataLoader", "DataModule", "Dataset", "Sampler")


@register
class InitModuleScope(Rule):
    """
    ## What it does
    Finds code other than model construction inside `with trainer.init_module():` or
    `with fabric.init_module():` — data modules, datasets, samplers, data loaders, `torch.Generator`s, and
    `trainer.fit/validate/test/predict` calls.

    ## Why is this bad?
    `init_module()` makes the strategy's device (the GPU) the default device for every tensor created
    inside the block. Datasets, samplers and generators created there end up on the GPU, and
    `DistributedSampler`/`RandomSampler` need a CPU generator: the run fails with
    `RuntimeError: Expected a 'cuda' device type for generator but found 'cpu'`, followed by
    `Please call iter(combined_loader) first`. With `strategy="ddp_spawn"` the same code appears to work,
    which only hides the problem.

    ## Known problems
    Only what the `with` block's own statements construct is read: a data module built by a helper
    called inside the block is seen as a call, by the helper's name.

    ## Example
    ```python
    with trainer.init_module():
        model = MyModel()
        data = MyDataModule()
        trainer.fit(model, datamodule=data)
    ```

    ## Use instead
    ```python
    with trainer.init_module():
        model = MyModel()
    data = MyDataModule()
    trainer.fit(model, datamodule=data)
    ```

    ## Fix safety
    No automatic fix: moving statements out of the block can change what they see (a variable defined
    later in the block).

    ## References
    - <https://lightning.ai/docs/pytorch/stable/advanced/model_init.html>
    - <https://lightning.ai/docs/fabric/stable/advanced/model_init.html>
    - <https://github.com/Lightning-AI/pytorch-lightning/issues/19373>
    """

    code = "DDP201"
    name = "init-module-scope"
    class_slug = "init-module-scope"
    severity = Severity.ERROR
    summary = "anything but model construction inside `trainer.init_module()` / `fabric.init_module()`"
    triggers = ("init_module",)

    def check(self, source: SourceFile) -> Iterator[Finding]:
        data_classes = source.subclasses_of("LightningDataModule") | _dataset_classes(source)
        for node in statements(source.tree.body):
            if not isinstance(node, (ast.With, ast.AsyncWith)):
                continue
            scope = next(
                (item.context_expr for item in node.items if _is_init_module(item.context_expr)), None
            )
            if scope is None:
                continue
            context = source.segment(scope)
            for call in branch_calls(node.body):
                what = self._misplaced(source, call, data_classes)
                if what:
                    yield self.finding(
                        source, call,
                        f"{what} inside `with {context}:` (line {node.lineno}): everything created there "
                        "defaults to the accelerator's device, and samplers need a CPU generator",
                        fix=Fix(message=f"keep only the model construction inside `with {context}:`"),
                    )

    def _misplaced(self, source: SourceFile, call: ast.Call, data_classes: set[str]) -> str | None:
        name = call_name(call)
        func = call.func
        if isinstance(func, ast.Attribute) and name in RUN_METHODS:
            receiver = (dotted(func.value) or "").rsplit(".", 1)[-1].lower()
            if "trainer" in receiver or "fabric" in receiver:
                return f"`{source.segment(func)}()` runs training or evaluation"
            return None
        qual = source.resolve(func) or ""
        if qual.startswith("torch.utils.data.") or name.endswith(DATA_SUFFIXES) or name in data_classes:
            return f"`{name}(...)` builds data"
        if qual == "torch.Generator":
            return "`torch.Generator(...)` creates a generator"
        return None


def _is_init_module(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "init_module"
    )


def _dataset_classes(source: SourceFile) -> set[str]:
    found = set()
    for name, cls in source.classes.items():
        for base in cls.bases:
            qual = source.resolve(base) or ""
            if qual.startswith("torch.utils.data.") or (dotted(base) or "").endswith(DATA_SUFFIXES):
                found.add(name)
    return found
