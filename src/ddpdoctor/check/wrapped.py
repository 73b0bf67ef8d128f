"""Which classes of a file are wrapped in `DistributedDataParallel`: `DDP(Model(...))`,
`DDP(Model().to(rank))`, or a name bound to an object of the class (`m = Model(); DDP(m)`). DDP402 asks it:
a module that DDP wraps runs on every rank's own device, so a device written into it is every rank's
device."""

from __future__ import annotations

import ast

from .source import SourceFile, statements


def ddp_wrapped_classes(source: SourceFile) -> set[str]:
    if "DistributedDataParallel" not in source.text:
        return set()
    wrapped: set[str] = set()
    bound: dict[str, str] = {}
    for node in statements(source.tree.body):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
        ):
            if node.value.func.id in source.classes:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        bound[target.id] = node.value.func.id
    for call in source.calls:
        qual = source.resolve(call.func) or ""
        if not qual.endswith("DistributedDataParallel") or not call.args:
            continue
        arg = call.args[0]
        while isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute):  # Model().to(rank)
            arg = arg.func.value
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id in source.classes:
            wrapped.add(arg.func.id)
        elif isinstance(arg, ast.Name) and arg.id in bound:
            wrapped.add(bound[arg.id])
    return wrapped
