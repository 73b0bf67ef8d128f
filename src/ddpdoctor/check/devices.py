"""On which device a value is made: the device domain the device rules ask (DDP202 today).

`torch.device("cuda")`, `"cuda:0"`, `"mps"`, `"meta"`... are accelerators (the CPU is not); a
`torch.Generator(device=...)` (through `.manual_seed(...)` chains) is on its device; a name is on an
accelerator when every binding of it that reaches the point asked is (`values.py`: joined over the paths of
the function, not one binding of the file); `torch.set_default_device(...)` and `with torch.device(...):`
change where what follows is made.
"""

from __future__ import annotations

import ast

from .source import SourceFile, keyword
from .values import scope_of_calls

ACCELERATORS = ("cuda", "mps", "xpu", "npu", "hpu", "xla", "meta")


def is_accelerator_device(source: SourceFile, node: ast.expr | None) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split(":")[0] in ACCELERATORS
    if isinstance(node, ast.Call) and source.resolve(node.func) == "torch.device" and node.args:
        return is_accelerator_device(source, node.args[0])
    return False


def _made_on_accelerator(source: SourceFile, node: ast.expr | None) -> bool:
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "manual_seed"
    ):
        node = node.func.value
    if not (isinstance(node, ast.Call) and source.resolve(node.func) == "torch.Generator"):
        return False
    device = keyword(node, "device")
    return is_accelerator_device(source, device.value if device else (node.args[0] if node.args else None))


def accelerator_generator(source: SourceFile, value: ast.expr) -> int | None:
    """The line where the generator `value` holds was made on an accelerator, or None: the expression
    itself, or a name every binding of which that reaches `value` is such a generator."""
    if _made_on_accelerator(source, value):
        return value.lineno
    if not isinstance(value, ast.Name):
        return None
    bound = scope_of_calls(source)(value).at(value).get(value.id)
    if not bound or not all(_made_on_accelerator(source, b.value) for b in bound):
        return None
    return min(b.line for b in bound)


def default_device_call(source: SourceFile, stmt: ast.stmt) -> bool | None:
    """True for `torch.set_default_device(<accelerator>)`, False for a reset to the CPU, None otherwise."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    if source.resolve(call.func) != "torch.set_default_device" or not call.args:
        return None
    return is_accelerator_device(source, call.args[0])


def device_context(source: SourceFile, stmt: ast.stmt) -> ast.expr | None:
    """`with torch.device("cuda"):`: the accelerator device the block makes its tensors on."""
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        for item in stmt.items:
            expr = item.context_expr
            if (
                isinstance(expr, ast.Call)
                and source.resolve(expr.func) == "torch.device"
                and is_accelerator_device(source, expr)
            ):
                return expr
    return None
