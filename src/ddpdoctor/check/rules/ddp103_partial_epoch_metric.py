from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..guards import branch_calls
from ..registry import Rule, register
from ..source import SourceFile, is_true, keyword

EPOCH_END_HOOKS = frozenset({
    "on_validation_epoch_end", "on_test_epoch_end", "on_train_epoch_end", "on_predict_epoch_end",
    "validation_epoch_end", "test_epoch_end", "training_epoch_end",
})
CONCATENATORS = frozenset({"cat", "concat", "concatenate", "stack", "vstack", "hstack"})
RANK_AWARE = ("is_global_zero", "global_rank", "rank_zero_only", "local_rank")
GATHERS = frozenset({"all_gather", "gather", "gather_for_metrics", "all_gather_object", "all_gather_into_tensor",
                     "gather_all_tensors", "_sync_ddp", "sync_ddp", "all_reduce", "gather_object"})


@register
class PartialEpochMetric(Rule):
    """
    ## What it does
    Finds epoch-end hooks of a LightningModule (`on_validation_epoch_end`, `on_test_epoch_end`, ...) that
    concatenate the outputs collected in the step hooks (`torch.cat(self.validation_step_outputs)`) and log
    a metric computed from them, without gathering them from the other ranks first — in a module that is
    trained with DDP (the metric is logged with `sync_dist=True`, the hook tests the rank, or the file
    selects a DDP strategy).

    ## Why is this bad?
    Under DDP each rank sees only its shard of the validation set (1/N of it). The concatenated outputs
    are that shard, so the "whole validation set" metric is a per-shard metric. `sync_dist=True` then
    averages the per-shard values, which is not the metric of the whole set for anything non-linear
    (AUC, F1, retrieval and ranking metrics) or for shards of unequal size. Nothing fails: the numbers
    are just wrong.

    ## Example
    ```python
    def on_validation_epoch_end(self):
        preds = torch.cat(self.validation_step_outputs)
        self.log("val_auc", auroc(preds, self.targets), sync_dist=True)
    ```

    ## Use instead
    ```python
    def on_validation_epoch_end(self):
        preds = self.all_gather(torch.cat(self.validation_step_outputs)).flatten(0, 1)
        self.log("val_auc", auroc(preds, self.targets), rank_zero_only=True)
    ```
    or accumulate a torchmetrics metric (`self.val_auc.update(...)` in the step), which syncs its state
    across ranks before computing.

    ## Fix safety
    No automatic fix: gathering changes shapes and memory use, and the right reduction depends on the
    metric.

    ## References
    - <https://lightning.ai/docs/pytorch/stable/extensions/logging.html#logging-from-a-lightningmodule>
    - <https://lightning.ai/docs/torchmetrics/stable/pages/lightning.html>
    - <https://lightning.ai/docs/pytorch/stable/common/lightning_module.html#all-gather>
    """

    code = "DDP103"
    name = "partial-epoch-metric"
    class_slug = "partial-epoch-metric"
    severity = Severity.WARNING
    summary = "epoch-end metric built from per-step outputs without a gather, in a DDP-trained module"
    triggers = ("epoch_end",)

    def check(self, source: SourceFile) -> Iterator[Finding]:
        for name in source.lightning_modules:
            for method in source.classes[name].body:
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.name in EPOCH_END_HOOKS:
                    yield from self._hook(source, method)

    def _hook(self, source: SourceFile, method: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[Finding]:
        calls = list(branch_calls(method.body))
        names = {_method_name(c) for c in calls}
        if names & GATHERS:
            return
        logs = [c for c in calls if _method_name(c) in ("log", "log_dict")]
        if not logs:
            return
        synced = any(is_true(kw.value) for c in logs if (kw := keyword(c, "sync_dist")) is not None)
        # Evidence that this module runs on several ranks: it syncs, tests the rank, or the file picks DDP.
        rank_aware = any(word in source.text_of(method) for word in RANK_AWARE)
        if not (synced or rank_aware or source.trains_with_ddp):
            return
        params = {a.arg for a in method.args.args[1:]}
        for call in calls:
            if _method_name(call) not in CONCATENATORS or not call.args:
                continue
            qual = source.resolve(call.func) or ""
            if not qual.startswith(("torch.", "numpy.")):
                continue
            if not _per_step_outputs(call.args[0], params):
                continue
            shown = source.segment(call)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            yield self.finding(
                source, call,
                f"`{shown}` in `{method.name}` holds only this rank's shard of the epoch's outputs under "
                f"DDP; the metric logged from it (line {logs[0].lineno}) is a per-shard metric, not the "
                "metric of the whole set",
                fix=Fix(message="gather first (`self.all_gather(...)`), or accumulate a torchmetrics metric"),
            )


def _method_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _per_step_outputs(node: ast.expr, params: set[str]) -> bool:
    """`self.validation_step_outputs`, `[o["preds"] for o in self.outputs]`, or the `outputs` argument
    of the old `validation_epoch_end(self, outputs)` hooks."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
            return True
        if isinstance(sub, ast.Name) and sub.id in params:
            return True
    return False
