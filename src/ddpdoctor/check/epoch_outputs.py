"""What a LightningModule collects per step and what its epoch-end hooks do with it: the values that hold
only this rank's share of an epoch's outputs (`self.outputs` appended in `validation_step`, concatenated in
`on_validation_epoch_end`), whether a hook gathers them, and how each is used (a metric over the whole set,
a linear reduction that a synced log would make right, or nothing that matters). DDP103 asks it."""

from __future__ import annotations

import ast
import enum
from collections.abc import Iterator

from .guards import branch_calls
from .metric_words import (
    ACCUMULATORS,
    CONCAT_LIBRARIES,
    CONCATENATORS,
    DISPLAY_WORDS,
    GATHER_WORDS,
    HARMLESS_FUNCTIONS,
    HARMLESS_METHODS,
    LINEAR_FUNCTIONS,
    LINEAR_METHODS,
    STEP_HOOKS,
    TRANSPARENT_FUNCTIONS,
    TRANSPARENT_METHODS,
)
from .source import SourceFile, call_name, dotted, is_lightning, is_true, keyword, statements


class Use(enum.Enum):
    """What the code does with a value that holds one rank's share of the epoch's outputs."""

    METRIC = "metric"  # into a metric function, a non-linear reduction, an evaluation
    LINEAR = "linear"  # mean / sum / count
    GATHERED = "gathered"  # sent through a gather first
    NONE = "none"  # a length, a truthiness test, a print, a reset


class LightningOutputs:
    """The methods of one LightningModule class, and what its step hooks collect."""

    def __init__(self, source: SourceFile, cls: ast.ClassDef, multi_device: bool,
                 log_owners: tuple[str, ...] = ("self",)):
        self.source = source
        self.log_owners = log_owners  # `self`, or a delegate's reference to the module (delegated_hooks.py)
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
                if any(word in call_name(call) for word in GATHER_WORDS):
                    return True
        return False

    def logs(self, method: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
        return [c for func in self._reachable(method) for c in branch_calls(func.body)
                if call_name(c) in ("log", "log_dict") and isinstance(c.func, ast.Attribute)
                and dotted(c.func.value) in self.log_owners]


class EpochEndHook:
    """One epoch-end hook: the values in it that hold this rank's outputs, and what is done with them."""

    def __init__(self, source: SourceFile, method: ast.FunctionDef | ast.AsyncFunctionDef,
                 module: LightningOutputs):
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
                call_name(call) in CONCATENATORS
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
        name = call_name(call)
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


def _self_attribute(node: ast.expr) -> str | None:
    """`self.preds` (also for `self.preds[k]`), else None."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _is_concatenation(call: ast.AST) -> bool:
    return isinstance(call, ast.Call) and call_name(call) in CONCATENATORS


def multi_device_trainer(source: SourceFile) -> bool:
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
