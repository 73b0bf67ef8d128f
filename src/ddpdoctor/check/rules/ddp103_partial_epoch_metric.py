from __future__ import annotations

import ast
import enum
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..guards import branch_calls
from ..registry import Rule, register
from ..source import SourceFile, dotted, is_lightning, is_true, keyword, statements

EPOCH_END_HOOKS = frozenset({
    "on_validation_epoch_end", "on_test_epoch_end", "on_train_epoch_end", "on_predict_epoch_end",
    "validation_epoch_end", "test_epoch_end", "training_epoch_end",
})
# Where per-batch results are collected (`self.outputs.append(...)` in `validation_step`).
STEP_HOOKS = frozenset({"on_validation_batch_end", "on_test_batch_end", "on_train_batch_end",
                        "on_predict_batch_end"})
CONCATENATORS = frozenset({"cat", "concat", "concatenate", "stack", "vstack", "hstack", "row_stack"})
CONCAT_LIBRARIES = ("torch.", "numpy.", "pandas.")
ACCUMULATORS = frozenset({"append", "extend", "update", "insert"})
RANK_AWARE = ("is_global_zero", "global_rank", "rank_zero_only", "local_rank")
GATHER_WORDS = ("gather", "all_reduce", "sync_ddp", "_sync_dist", "broadcast_object")
# Reductions for which the mean over equal shards (what `sync_dist=True` logs) is the whole set's value.
LINEAR_METHODS = frozenset({"mean", "sum", "nanmean", "nansum", "count", "numel", "count_nonzero"})
LINEAR_FUNCTIONS = frozenset(
    {
        "mean",
        "sum",
        "nanmean",
        "nansum",
        "fmean",
        "count_nonzero",
        # per-sample means: the mean over equal shards is the whole set's value
        "accuracy",
        "accuracy_score",
        "mean_squared_error",
        "mean_absolute_error",
        "mse_loss",
        "l1_loss",
        "cross_entropy",
        "nll_loss",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "smooth_l1_loss",
        "huber_loss",
    }
)
# Calls that keep the values as they are (a view, a copy, another container, another dtype).
TRANSPARENT_METHODS = frozenset(
    {
        "float",
        "double",
        "half",
        "long",
        "int",
        "bool",
        "detach",
        "cpu",
        "cuda",
        "to",
        "view",
        "reshape",
        "flatten",
        "squeeze",
        "unsqueeze",
        "numpy",
        "tolist",
        "contiguous",
        "clone",
        "type",
        "to_numpy",
        "values",
        "ravel",
        "astype",
        "reset_index",
        "copy",
    }
)
TRANSPARENT_FUNCTIONS = frozenset({"tensor", "as_tensor", "array", "asarray", "list", "tuple", "float", "int",
                                   "DataFrame", "from_numpy"} | CONCATENATORS)
HARMLESS_FUNCTIONS = frozenset({"len", "print", "isinstance", "type", "str", "repr", "id", "bool"})
# Showing or writing this rank's outputs (an image grid, a plot, a file) is no metric of the whole set.
DISPLAY_WORDS = (
    "image",
    "plot",
    "grid",
    "figure",
    "hist",
    "video",
    "audio",
    "table",
    "save",
    "write",
    "dump",
    "show",
    "draw",
    "visual",
    "print",
)
HARMLESS_METHODS = frozenset(
    {
        "clear",
        "append",
        "extend",
        "update",
        "reset",
        "insert",
        "pop",
        "keys",
        "items",
        "size",
        "dim",
        "any",
        "all",
        "info",
        "debug",
        "warning",
        "write",
        "empty",
    }
)


class Use(enum.Enum):
    """What the code does with a value that holds one rank's share of the epoch's outputs."""

    METRIC = "metric"  # into a metric function, a non-linear reduction, an evaluation
    LINEAR = "linear"  # mean / sum / count
    GATHERED = "gathered"  # sent through a gather first
    NONE = "none"  # a length, a truthiness test, a print, a reset


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
    triggers = ("epoch_end",)

    def check(self, source: SourceFile) -> Iterator[Finding]:
        multi_device = _multi_device_trainer(source)
        for name in source.lightning_modules:
            module = _Module(source, source.classes[name], multi_device)
            for method in module.methods.values():
                if method.name in EPOCH_END_HOOKS:
                    yield from self._hook(source, module, method)

    def _hook(self, source: SourceFile, module: _Module, method: ast.FunctionDef | ast.AsyncFunctionDef
              ) -> Iterator[Finding]:
        if module.gathers(method):
            return
        logs = module.logs(method)
        if not logs:
            return
        synced = any(is_true(kw.value) for c in logs if (kw := keyword(c, "sync_dist")) is not None)
        if not (synced or module.synced or module.multi_device or source.trains_with_ddp
                or any(word in source.text_of(method) for word in RANK_AWARE)):
            return
        hook = _Hook(source, method, module)
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


class _Module:
    """The methods of one LightningModule class, and what its step hooks collect."""

    def __init__(self, source: SourceFile, cls: ast.ClassDef, multi_device: bool):
        self.source = source
        self.multi_device = multi_device
        self.methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.collected: set[str] = set()  # `self.preds` filled batch by batch
        self.synced = False
        for method in self.methods.values():
            per_step = method.name.endswith("_step") or method.name in STEP_HOOKS
            for call in branch_calls(method.body):
                sync = keyword(call, "sync_dist")
                if sync is not None and is_true(sync.value):
                    self.synced = True
                if per_step and isinstance(call.func, ast.Attribute) and call.func.attr in ACCUMULATORS:
                    target = _self_attribute(call.func.value)
                    if target:
                        self.collected.add(target)
            if per_step:
                for node in statements(method.body):
                    if isinstance(node, ast.AugAssign) and (target := _self_attribute(node.target)):
                        self.collected.add(target)

    def _reachable(
        self, method: ast.FunctionDef | ast.AsyncFunctionDef
    ) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        """The method and the module's methods it calls, at any depth."""
        seen = [method]
        stack = [method]
        while stack:
            for call in branch_calls(stack.pop().body):
                func = call.func
                if (
                    isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name)
                    and func.value.id == "self"
                ):
                    target = self.methods.get(func.attr)
                    if target is not None and target not in seen:
                        seen.append(target)
                        stack.append(target)
        return seen

    def gathers(self, method: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        for func in self._reachable(method):
            if any(word in func.name for word in GATHER_WORDS):
                return True
            for call in branch_calls(func.body):
                if any(word in _method_name(call) for word in GATHER_WORDS):
                    return True
        return False

    def logs(self, method: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
        return [c for func in self._reachable(method) for c in branch_calls(func.body)
                if _method_name(c) in ("log", "log_dict") and isinstance(c.func, ast.Attribute)
                and dotted(c.func.value) == "self"]


class _Hook:
    """One epoch-end hook: the values in it that hold this rank's outputs, and what is done with them."""

    def __init__(self, source: SourceFile, method: ast.FunctionDef | ast.AsyncFunctionDef, module: _Module):
        self.source = source
        self.method = method
        self.module = module
        self.params = {a.arg for a in method.args.args[1:]}
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(method):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node

    def _outputs(self, node: ast.expr) -> bool:
        """`self.validation_step_outputs`, `[o["preds"] for o in self.outputs]`, or the `outputs` argument
        of the old `validation_epoch_end(self, outputs)` hooks."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                return True
            if isinstance(sub, ast.Name) and sub.id in self.params:
                return True
        return False

    def partial_values(self) -> Iterator[tuple[ast.expr, ast.AST, str]]:
        """(value, where to report, what it holds) for each value that holds this rank's outputs."""
        calls = list(branch_calls(self.method.body))
        for call in calls:
            if (
                _method_name(call) in CONCATENATORS
                and call.args
                and (self.source.resolve(call.func) or "").startswith(CONCAT_LIBRARIES)
                and self._outputs(call.args[0])
            ):
                yield call, call, f"`{_short(self.source.segment(call))}`"
        # Lists and dicts filled in the hook from the collected outputs: `preds.extend(o["preds"])`.
        for loop in statements(self.method.body):
            if not (isinstance(loop, (ast.For, ast.AsyncFor)) and self._outputs(loop.iter)):
                continue
            for call in branch_calls(loop.body):
                func = call.func
                if (
                    isinstance(func, ast.Attribute)
                    and func.attr in ACCUMULATORS
                    and isinstance(func.value, ast.Name)
                ):
                    yield func.value, call, f"`{func.value.id}`, filled from the collected outputs,"
                    break
        # Attributes the step hooks fill, used as they are.
        for node in ast.walk(self.method):
            name = _self_attribute(node) if isinstance(node, ast.Attribute) else None
            if (
                name in self.module.collected
                and isinstance(self.parents.get(node), ast.Call)
                and node in getattr(self.parents[node], "args", ())
                and not _is_concatenation(self.parents[node])
            ):
                yield node, self.parents[node], f"`self.{name}`, filled batch by batch,"  # type: ignore[misc]

    def use_of(self, value: ast.expr) -> Use:
        """The strongest use of `value` in the hook (a metric over a linear reduction over nothing)."""
        if isinstance(value, ast.Name):
            uses = [self._consumer(n, set()) for n in ast.walk(self.method)
                    if isinstance(n, ast.Name) and n.id == value.id and isinstance(n.ctx, ast.Load)]
            return _strongest(uses)
        return self._consumer(value, set())

    def _consumer(self, node: ast.AST, seen: set[str]) -> Use:
        parent = self.parents.get(node)
        if parent is None:
            return Use.NONE
        if isinstance(parent, ast.Attribute):
            call = self.parents.get(parent)
            if isinstance(call, ast.Call) and call.func is parent:
                method = parent.attr
                if any(word in method for word in GATHER_WORDS):
                    return Use.GATHERED
                if method in LINEAR_METHODS:
                    return Use.LINEAR
                if method in TRANSPARENT_METHODS:
                    return self._consumer(call, seen)
                if method in HARMLESS_METHODS:
                    return Use.NONE
                return Use.METRIC  # median, max, topk, quantile, std, sort, ...
            if parent.attr in ("shape", "empty", "size", "ndim", "dtype", "device", "columns", "index"):
                return Use.NONE
            return self._consumer(parent, seen)  # a column of a frame, an attribute of a result
        if isinstance(parent, ast.keyword):
            return self._argument_of(self.parents.get(parent), seen)
        if isinstance(parent, ast.Call):
            if parent.func is node:
                return Use.NONE
            return self._argument_of(parent, seen)
        if (
            isinstance(parent, ast.Tuple)
            and isinstance(assign := self.parents.get(parent), ast.Assign)
            and (
                assign.value is parent
                and len(assign.targets) == 1
                and isinstance(assign.targets[0], ast.Tuple)
                and len(assign.targets[0].elts) == len(parent.elts)
            )
        ):
            # `scores, targets = torch.cat(a), torch.cat(b)`: follow the matching name.
            target = assign.targets[0].elts[parent.elts.index(node)]  # type: ignore[arg-type]
            if isinstance(target, ast.Name) and target.id not in seen:
                seen.add(target.id)
                return _strongest(
                    [
                        self._consumer(n, seen)
                        for n in ast.walk(self.method)
                        if isinstance(n, ast.Name) and n.id == target.id and isinstance(n.ctx, ast.Load)
                    ]
                )
            return Use.NONE
        if isinstance(parent, (ast.Subscript, ast.BinOp, ast.Starred, ast.List, ast.Tuple, ast.Dict,
                               ast.IfExp)):
            return self._consumer(parent, seen)
        if isinstance(parent, ast.Compare):
            holder = self.parents.get(parent)
            if isinstance(holder, (ast.If, ast.While, ast.Assert, ast.BoolOp, ast.UnaryOp)):
                return Use.NONE
            return self._consumer(parent, seen)  # `(preds == labels)` goes on into its reduction
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is node:
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            names = [t.id for t in targets if isinstance(t, ast.Name) and t.id not in seen]
            seen.update(names)
            return _strongest([self._consumer(n, seen) for n in ast.walk(self.method)
                               if isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load)])
        return Use.NONE

    def _argument_of(self, call: ast.AST | None, seen: set[str]) -> Use:
        if not isinstance(call, ast.Call):
            return Use.NONE
        name = _method_name(call)
        if any(word in name for word in GATHER_WORDS):
            return Use.GATHERED
        if name in LINEAR_FUNCTIONS:
            return Use.LINEAR
        if name in ("log", "log_dict"):
            return Use.LINEAR  # logged as it is: Lightning reduces it (by mean with sync_dist)
        if name in TRANSPARENT_FUNCTIONS:
            return self._consumer(call, seen)
        if (
            name in HARMLESS_FUNCTIONS
            or name in HARMLESS_METHODS
            or any(w in name.lower() for w in DISPLAY_WORDS)
        ):
            return Use.NONE
        return Use.METRIC


_ORDER = (Use.NONE, Use.LINEAR, Use.METRIC)


def _strongest(uses: list[Use]) -> Use:
    if Use.GATHERED in uses:
        return Use.GATHERED
    return max(uses, key=_ORDER.index, default=Use.NONE)


def _short(text: str) -> str:
    text = text.split("\n", 1)[0]
    return text if len(text) <= 60 else text[:57] + "..."


def _method_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _self_attribute(node: ast.expr) -> str | None:
    """`self.preds` (also for `self.preds[k]`), else None."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _is_concatenation(call: ast.AST) -> bool:
    return isinstance(call, ast.Call) and _method_name(call) in CONCATENATORS


def _multi_device_trainer(source: SourceFile) -> bool:
    """The file builds a Lightning `Trainer` whose `devices` (or `gpus`) is set from a variable: it may run
    on several devices, where Lightning picks DDP. Also through `Trainer(**args)` with `args` a dict literal
    of the same function."""
    if "Trainer" not in source.text:
        return False
    dicts: dict[str, ast.Dict] = {}
    for node in statements(source.tree.body):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    dicts[target.id] = node.value
    for call in source.calls:
        if not is_lightning(source.resolve(call.func), "Trainer"):
            continue
        for kw in call.keywords:
            if kw.arg in ("devices", "gpus") and _several(kw.value):
                return True
            if kw.arg is None and isinstance(kw.value, ast.Name) and kw.value.id in dicts:
                table = dicts[kw.value.id]
                for key, value in zip(table.keys, table.values, strict=False):
                    if isinstance(key, ast.Constant) and key.value in ("devices", "gpus") and _several(value):
                        return True
    return False


def _several(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value not in (1, "1", None, 0, "0", "auto") and not isinstance(node.value, bool)
    if isinstance(node, (ast.List, ast.Tuple)):
        return len(node.elts) > 1
    return True  # from a variable, an argument, a config
