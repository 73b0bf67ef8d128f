"""Epoch-end hooks a LightningModule hands to another object: `def validation_epoch_end(self, outputs):
return self.task.validation_epoch_end(outputs)`. The object's class is not known statically (an attribute
filled from configuration), so the hook's body is every project method of that name outside a
LightningModule, and what it logs through its reference to the module (`self.model.log("val_eer", ...)`)
is the module's `log`. DDP103 reads those methods as the module's own hooks."""

from __future__ import annotations

import ast

from .metric_words import EPOCH_END_HOOKS
from .source import SourceFile, dotted


def delegated_hooks(source: SourceFile) -> frozenset[str]:
    """The epoch-end hooks that a LightningModule of this file hands, with its outputs, to a method of the
    same name on one of its attributes (`self.task.validation_epoch_end(outputs)`)."""
    if "_epoch_end" not in source.text:
        return frozenset()
    found: set[str] = set()
    for name in source.lightning_modules:
        for method in source.classes[name].body:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
                    method.name not in EPOCH_END_HOOKS):
                continue
            params = {a.arg for a in method.args.args[1:]}
            for node in ast.walk(method):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                        node.func.attr == method.name) and (dotted(node.func.value) or "").startswith(
                        "self.") and (not params or any(isinstance(a, ast.Name) and a.id in params
                                                        for a in node.args)):
                    found.add(method.name)
    return frozenset(found)


def module_references(method: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    """The attributes a delegate's hook logs through as Lightning does (`self.model.log("val_eer", x)`): a
    `log`/`log_dict` whose first argument is the metric's name or dict, not a logging level."""
    found: list[str] = []
    for node in ast.walk(method):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("log", "log_dict") and node.args):
            continue
        owner = dotted(node.func.value) or ""
        first = node.args[0]
        named = isinstance(first, ast.JoinedStr) or isinstance(first, ast.Constant) and isinstance(
            first.value, str) or node.func.attr == "log_dict" and isinstance(first, (ast.Dict, ast.Name))
        if owner.startswith("self.") and owner.count(".") == 1 and named and owner not in found:
            found.append(owner)
    return tuple(found)
