"""Which expressions of a file hold a torchmetrics metric, whose `compute()` and `sync()` gather the
metric states from every process (torchmetrics 1.9.0 `Metric._wrap_compute` -> `sync_context`).

A metric class is a torchmetrics class, or a class of the project that derives from one (in this file or,
through the project index, in another: `class MeanMetric(BaseAggregator)` in a utility module). A metric
is made by calling such a class, or a name bound to one (`meter = MeanMetric if test else AverageMeter`,
then `meter(device=d)`: it may be a metric), and stays one through `.to(...)`, `.cuda()`, `.clone()`.
What holds it: the names and attributes it is assigned to, anywhere in the file (`self.acc`, `meter`); the
containers it is put in (`{k: Metric() for k in keys}`, `[Metric(), ...]`, `nn.ModuleDict({...})`,
`stats[k] = Metric()`), read back by subscript or by a loop or comprehension over them (`for k, v in
stats.items(): v.compute()`). By name, as the rest of the checker's file-wide bindings: a name bound to
a metric somewhere holds one wherever it is read. A metric built with `sync_on_compute=False` does not
sync and is not one; a metric handed to Lightning's `self.log` is computed by Lightning on every rank at
epoch end, so an early `compute()` on rank 0 joins the same gather and is not one either.
"""

from __future__ import annotations

import ast
from functools import cached_property
from typing import TYPE_CHECKING

from .source import dotted, keyword, statements

if TYPE_CHECKING:
    from .source import SourceFile

MAX_ROUNDS = 4  # names bound from other names: `m = self.acc` after `self.acc = Accuracy()`
KEEPS_METRIC = frozenset({"to", "cuda", "cpu", "clone", "double", "float", "half", "set_dtype", "type"})
CONTAINER_CALLS = frozenset({"ModuleDict", "ModuleList", "dict", "list", "tuple", "OrderedDict"})


def derives_from_torchmetrics(source: SourceFile) -> frozenset[str]:
    """The classes of this file that derive from a torchmetrics class, directly or through classes of this
    file (kept in the file's summary, for files that make them)."""
    if "torchmetrics" not in source.text:
        return frozenset()
    return frozenset(source._subclasses(
        lambda base: (source.resolve(base) or "").startswith("torchmetrics.")))


class MetricObjects:
    """The metric holders of one file, and whether a receiver is one."""

    def __init__(self, source: SourceFile):
        self.source = source

    def holds(self, receiver: ast.expr) -> bool:
        """Whether `receiver` (the object a `.compute()` is called on) holds a metric."""
        if not self._holders and not self._containers:
            return False
        name = dotted(receiver)
        if name is not None and name in self._holders:
            return True
        if isinstance(receiver, ast.Subscript) and (dotted(receiver.value) or "") in self._containers:
            return True
        return id(receiver) in self._items

    @cached_property
    def _local_classes(self) -> frozenset[str]:
        return derives_from_torchmetrics(self.source)

    def _is_class(self, expr: ast.expr, class_names: set[str]) -> bool:
        """A metric class, or a name bound to one (in either branch of `a if c else b`)."""
        if isinstance(expr, ast.IfExp):
            return self._is_class(expr.body, class_names) or self._is_class(expr.orelse, class_names)
        if not isinstance(expr, (ast.Name, ast.Attribute)):
            return False
        name = dotted(expr)
        if name is not None and (name in class_names or name in self._local_classes):
            return True
        qual = self.source.resolve(expr) or ""
        if qual.startswith("torchmetrics.") and qual.rsplit(".", 1)[-1][:1].isupper():
            return True
        project = self.source.project
        if project is None or not project.has_metric_classes:
            return False
        found = project.resolver(self.source).callee(expr, None)
        return found is not None and project.metric_class(found[0])

    def _makes(self, expr: ast.expr, names: _Names) -> bool:
        """An expression whose value is (or may be) a metric."""
        if isinstance(expr, ast.IfExp):
            return self._makes(expr.body, names) or self._makes(expr.orelse, names)
        if isinstance(expr, (ast.Name, ast.Attribute)):
            return dotted(expr) in names.holders
        if not isinstance(expr, ast.Call):
            return False
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr in KEEPS_METRIC:
            return self._makes(func.value, names)
        if not self._is_class(func, names.classes):
            return False
        sync = keyword(expr, "sync_on_compute")
        return not (sync is not None and isinstance(sync.value, ast.Constant) and sync.value.value is False)

    def _fills(self, expr: ast.expr, names: _Names) -> bool:
        """A container whose items are (or may be) metrics."""
        if isinstance(expr, ast.IfExp):
            return self._fills(expr.body, names) or self._fills(expr.orelse, names)
        if isinstance(expr, ast.Dict):
            return any(self._makes(value, names) for value in expr.values)
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            return any(self._makes(value, names) for value in expr.elts)
        if isinstance(expr, ast.DictComp):
            return self._makes(expr.value, names)
        if isinstance(expr, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return self._makes(expr.elt, names)
        if isinstance(expr, (ast.Name, ast.Attribute)):
            return dotted(expr) in names.containers
        if isinstance(expr, ast.Call) and (dotted(expr.func) or "").rsplit(".", 1)[-1] in CONTAINER_CALLS:
            return any(self._fills(arg, names) for arg in expr.args)
        return False

    @cached_property
    def _names(self) -> _Names:
        names = _Names()
        if "torchmetrics" not in self.source.text and (
                self.source.project is None or not self.source.project.has_metric_classes):
            return names
        assigns = [node for node in statements(self.source.tree.body) if isinstance(node, ast.Assign)]
        for _ in range(MAX_ROUNDS):
            before = names.size()
            for node in assigns:
                for target in node.targets:
                    name = dotted(target)
                    if name is not None:
                        if self._is_class(node.value, names.classes):
                            names.classes.add(name)
                        elif self._makes(node.value, names):
                            names.holders.add(name)
                        elif self._fills(node.value, names):
                            names.containers.add(name)
                    elif isinstance(target, ast.Subscript) and self._makes(node.value, names):
                        held = dotted(target.value)
                        if held is not None:
                            names.containers.add(held)
            if names.size() == before:
                break
        # A metric object handed to `self.log` is computed by Lightning on every rank at epoch end; a
        # compute() on rank 0 alone before that joins the same gather, so it does not hang.
        for call in self.source.calls:
            if isinstance(call.func, ast.Attribute) and call.func.attr in ("log", "log_dict"):
                for arg in [*call.args, *(kw.value for kw in call.keywords)]:
                    for sub in ast.walk(arg):
                        if isinstance(sub, (ast.Attribute, ast.Name)):
                            names.holders.discard(dotted(sub) or "")
        return names

    @property
    def _holders(self) -> set[str]:
        return self._names.holders

    @property
    def _containers(self) -> set[str]:
        return self._names.containers

    @cached_property
    def _items(self) -> frozenset[int]:
        """The `Name` nodes that read an item of a metric container through the loop or comprehension that
        binds it: `v` in `for k, v in stats.items(): v.compute()`, `{k: v.compute() for k, v in ...}`."""
        if not self._containers:
            return frozenset()
        found: set[int] = set()
        for node in ast.walk(self.source.tree):
            if isinstance(node, (ast.For, ast.AsyncFor)):
                name = self._item_name(node.target, node.iter)
                if name is not None:
                    found.update(_reads(node.body, name))
            elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
                parts: list[ast.AST] = (
                    [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt])
                for generator in node.generators:
                    name = self._item_name(generator.target, generator.iter)
                    if name is not None:
                        found.update(_reads([*parts, *generator.ifs], name))
        return frozenset(found)

    def _item_name(self, target: ast.expr, iterable: ast.expr) -> str | None:
        """The name a loop binds to an item of a metric container: `v` of `for v in c`, `for v in
        c.values()`, `for k, v in c.items()`, `for i, v in enumerate(c)`."""
        pair = False
        if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and (
                iterable.func.id == "enumerate") and iterable.args:
            iterable, pair = iterable.args[0], True
        elif isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute) and (
                iterable.func.attr in ("items", "values")) and not iterable.args:
            pair = iterable.func.attr == "items"
            iterable = iterable.func.value
        if (dotted(iterable) or "") not in self._containers:
            return None
        if pair:
            if isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2:
                target = target.elts[1]
            else:
                return None
        return target.id if isinstance(target, ast.Name) else None


class _Names:
    """The file's names that hold metric classes, metrics and containers of metrics."""

    def __init__(self) -> None:
        self.classes: set[str] = set()
        self.holders: set[str] = set()
        self.containers: set[str] = set()

    def size(self) -> int:
        return len(self.classes) + len(self.holders) + len(self.containers)


def _reads(nodes: list, name: str) -> set[int]:
    return {id(sub) for node in nodes for sub in ast.walk(node)
            if isinstance(sub, ast.Name) and sub.id == name and isinstance(sub.ctx, ast.Load)}
