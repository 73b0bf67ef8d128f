from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..delegated_hooks import module_references
from ..epoch_outputs import (
    EpochEndHook,
    LightningOutputs,
    Use,
    multi_device_trainer,
)
from ..metric_words import EPOCH_END_HOOKS, RANK_AWARE
from ..program import program_is_distributed
from ..registry import Rule, register
from ..shard_metrics import shard_metrics
from ..source import SourceFile, is_true, keyword


@register
class PartialEpochMetric(Rule):
    """
    ## What it does
    Finds epoch-end hooks of a LightningModule (`on_validation_epoch_end`, `on_test_epoch_end`, ...) that
    turn the outputs collected during the epoch into a "whole set" metric without gathering them from the
    other ranks first, in a module trained with DDP (a metric is logged with `sync_dist=True`, the hook
    tests the rank, the file selects a DDP strategy, or it builds its `Trainer` with a `devices` setting
    that is not a literal 1).

    The per-rank outputs are recognised as:
    - a concatenation of what the step hooks collected: `torch.cat` / `torch.stack` / `np.concatenate` /
      `pd.concat(self.predictions)` of an attribute, or of the `outputs` argument of the old hooks;
    - a local list or dict filled from them in the hook (`all_preds.extend(o["preds"])`,
      `results.update(o)` in a loop over `self.outputs`);
    - an attribute that the step hooks fill (`self.preds.extend(...)` in `validation_step`) used directly.

    It is reported when that value goes into a metric: a function (`roc_auc_score`, `f1_score`, an
    `evaluate(...)` helper), an index into it, or a reduction that is not linear (`median`, `max`, `topk`,
    `quantile`, `std`, "the best of the epoch"), and the hook (or a method of the module it calls) logs.
    Linear reductions (`mean`, `sum`, a count) are reported only when what is logged is not synced: the
    standard idiom `self.log("val_mse", torch.stack(self.val_losses).mean(), sync_dist=True)` is correct,
    as the mean of equal shards' means is the mean; so are per-sample losses and accuracy computed from the
    concatenation (`F.cross_entropy`, `accuracy_score`). Showing or writing the outputs (an image grid, a
    plot, a file) is not a metric. Nothing is reported once the hook gathers:
    `self.all_gather`, `accelerator.gather_for_metrics`, `dist.all_gather_object`, or a method of the
    module whose name or body gathers (`self._gather_prediction_frames(...)`).

    A hook the module hands on (`def validation_epoch_end(self, outputs): return
    self.task.validation_epoch_end(outputs)`) is read where it lands: the attribute's class is not known
    statically, so every method of that name in a class of the same program that is no LightningModule is
    read as the hook, and what it logs through its reference to the module (`self.model.log("val_eer",
    ...)`, a name as first argument, not a logging level) is the module's `log`.

    Outside Lightning, in a distributed program: a function of the file that loops over the loader it is
    given, adds into locals (`total += loss.item()`) and returns them without a reduction, called with a
    loader whose `sampler=` is a `DistributedSampler` (each rank reads its own share), whose result (or a
    ratio of it) is compared before any `all_reduce`/gather (`if score < best:`) is reported, hedged, at
    the call: the best model is chosen on one rank's share. Samplers of other libraries that shard by rank,
    and loaders made in another file, are not followed.

    Limits: the outputs must reach the metric inside the hook or through the module's own methods; a
    metric computed by a function of another module is seen as a call taking the outputs, and counted.

    ## Why is this bad?
    Under DDP each rank sees only its shard of the validation set (1/N of it). The concatenated outputs
    are that shard, so the "whole validation set" metric is a per-shard metric. `sync_dist=True` then
    averages the per-shard values, which is not the metric of the whole set for anything non-linear
    (AUC, F1, retrieval and ranking metrics) or for shards of unequal size. Nothing fails: the numbers
    are just wrong.

    ## Known problems
    The outputs must reach the metric inside the hook or through the module's own methods; a metric
    computed by a function of another module is seen as a call taking the outputs, and counted. A gather
    through a helper the checker does not know is taken as no gather.

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
    across ranks before computing. A pandas frame of predictions can be gathered with
    `dist.all_gather_object` and concatenated on every rank.

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
    triggers = ("epoch_end", "DistributedSampler")

    project_wide = True  # a module's hook may be handed to a method of another file (delegated_hooks.py)

    def check(self, source: SourceFile) -> Iterator[Finding]:
        multi_device = multi_device_trainer(source)
        for name in source.lightning_modules:
            module = LightningOutputs(source, source.classes[name], multi_device)
            for method in module.methods.values():
                if method.name in EPOCH_END_HOOKS:
                    yield from self._hook(source, module, method)
        if "DistributedSampler" in source.text and program_is_distributed(source):
            for found in shard_metrics(source):
                yield self.finding(
                    source, found.call,
                    f"`{source.segment(found.call)}` sums over `{found.loader}`, whose DistributedSampler "
                    f"gives each rank its own share of the data, and line {found.used.lineno} compares the "
                    "result without a reduction across ranks: a per-shard metric decides, and each rank may "
                    "decide differently",
                    fix=Fix(message="`dist.all_reduce` the sums (and counts) before dividing and comparing"),
                    facts={"hedged": True},
                )
        project = source.project
        if project is None or source.path not in project.modules:
            return
        delegated = {hook for m in project.component(source.path) for hook in m.delegated_hooks}
        for name, cls in source.classes.items():
            if name in source.lightning_modules or not delegated:
                continue
            for item in cls.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        item.name in delegated) and (owners := module_references(item)):
                    module = LightningOutputs(source, cls, multi_device, ("self", *owners))
                    yield from self._hook(source, module, item)

    def _hook(self, source: SourceFile, module: LightningOutputs,
              method: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[Finding]:
        if module.gathers(method):
            return
        logs = module.logs(method)
        if not logs:
            return
        synced = any(is_true(kw.value) for c in logs if (kw := keyword(c, "sync_dist")) is not None)
        if not (synced or module.synced or module.multi_device or source.trains_with_ddp
                or any(word in source.text_of(method) for word in RANK_AWARE)):
            return
        hook = EpochEndHook(source, method, module)
        reported: set[ast.AST] = set()
        for value, anchor, holder in hook.partial_values():
            if anchor in reported:
                continue
            use = hook.use_of(value)
            if use == Use.METRIC or use == Use.LINEAR and not synced:
                reported.add(anchor)
                how = ("it goes into a metric" if use == Use.METRIC else
                       "what is logged from it is not synced")
                yield self.finding(
                    source,
                    anchor,
                    f"{holder} in `{method.name}` holds only this rank's shard of the epoch's outputs under "
                    f"DDP, and {how} (logged at line {logs[0].lineno}): a per-shard metric, not the metric "
                    "of the "
                    "whole set",
                    fix=Fix(
                        message="gather first (`self.all_gather(...)`, `dist.all_gather_object` for frames), "
                        "or accumulate a torchmetrics metric"
                    ),
                )
