"""Where a tensor is: the expressions that make a CPU tensor, shared by DDP301 and the project index."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from .source import call_name, keyword

if TYPE_CHECKING:
    from .source import SourceFile

FACTORIES = frozenset(
    {
        "tensor",
        "as_tensor",
        "ones",
        "zeros",
        "empty",
        "full",
        "rand",
        "randn",
        "randint",
        "arange",
        "linspace",
        "eye",
        "LongTensor",
        "FloatTensor",
        "IntTensor",
        "Tensor",
        "from_numpy",
    }
)


def cpu_expression(source: SourceFile, node: ast.expr) -> str | None:
    """How an expression makes a CPU tensor: a factory without `device=`, `.cpu()`, `.to("cpu")`."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    last = call_name(node)
    if last not in FACTORIES and last not in ("cpu", "to"):
        return None  # most calls: no import to resolve
    if isinstance(func, ast.Attribute) and func.attr == "cpu" and not node.args:
        return f"`.cpu()`, line {node.lineno}"
    if isinstance(func, ast.Attribute) and func.attr == "to" and node.args and isinstance(
            node.args[0], ast.Constant) and node.args[0].value == "cpu":
        return f"`.to(\"cpu\")`, line {node.lineno}"
    qual = source.resolve(func) or ""
    head, _, name = qual.rpartition(".")
    device = keyword(node, "device")
    if device is not None and head == "torch" and name in FACTORIES and _names_cpu(device.value):
        return f"created with `device=\"cpu\"`, line {node.lineno}"  # said outright: the CPU for certain
    if device is not None or any(k.arg is None for k in node.keywords):
        return None  # `device=` given, or possibly given through a `**mapping`: not known to be the CPU
    if head == "torch" and name in FACTORIES:
        return f"created without `device=`, line {node.lineno}"
    return None


def _names_cpu(node: ast.expr) -> bool:
    """`"cpu"`, `torch.device("cpu")`."""
    if isinstance(node, ast.Call) and call_name(node) == "device" and len(node.args) == 1:
        node = node.args[0]
    return isinstance(node, ast.Constant) and node.value == "cpu"
