from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..registry import Rule, register
from ..source import SourceFile, keyword, statements

FACTORIES = frozenset({"tensor", "as_tensor", "ones", "zeros", "empty", "full", "rand", "randn", "randint", "arange",
                       "linspace", "eye", "LongTensor", "FloatTensor", "IntTensor", "Tensor", "from_numpy"})
# Position of the tensor argument(s) of each collective that moves tensor data.
TENSOR_ARGS = {
    "all_reduce": (0,), "broadcast": (0,), "reduce": (0,), "all_gather": (1,), "all_gather_into_tensor": (0, 1),
    "reduce_scatter_tensor": (0, 1), "all_to_all_single": (0, 1), "gather": (0,), "scatter": (0,),
}


@register
class CpuTensorOnNcclGroup(Rule):
    """
    ## What it does
    Finds collectives on tensors created without a device (`torch.tensor(x)`, `torch.zeros(n)`, ...: CPU
    tensors) in a file that initialises the default process group with backends for `cuda` only
    (`"nccl"`, `"cuda:nccl"`, or `"cuda:gloo"`, the CPU stand-in for it).

    ## Why is this bad?
    A process group holds one backend per device type. `init_process_group("nccl")` registers NCCL for
    `cuda` only, so a collective on a CPU tensor has no backend at all and fails with
    `RuntimeError: No backend type associated with device type cpu`. The same code passes on a CPU
    test machine with gloo, and fails on the GPU cluster.

    ## Example
    ```python
    dist.init_process_group("nccl")
    loss_sum = torch.tensor(total)
    dist.all_reduce(loss_sum)
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    loss_sum = torch.tensor(total, device=f"cuda:{local_rank}")
    dist.all_reduce(loss_sum)
    ```
    or register a backend for both device types: `init_process_group(backend="cpu:gloo,cuda:nccl")`.

    ## Fix safety
    No automatic fix: the right device is the rank's device, which the checker cannot name.

    ## References
    - <https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group>
    - <https://github.com/Lightning-AI/pytorch-lightning/issues/19912>
    """

    code = "DDP301"
    name = "cpu-tensor-nccl-collective"
    class_slug = "backend-device-mismatch"
    severity = Severity.ERROR
    summary = "a collective on a tensor created without a device where the group is NCCL-only"
    triggers = ("nccl",)

    def check(self, source: SourceFile) -> Iterator[Finding]:
        init_line = _nccl_only_init(source)
        if init_line is None or "set_default_device" in source.text:
            return
        cpu_names = _cpu_tensor_names(source)
        for call in source.calls:
            qual = source.resolve(call.func) or ""
            head, _, op = qual.rpartition(".")
            if not head.startswith("torch.distributed") or op not in TENSOR_ARGS:
                continue
            for index in TENSOR_ARGS[op]:
                arg = call.args[index] if index < len(call.args) else None
                if arg is None:
                    continue
                created = _cpu_factory_line(source, arg)
                if created is None and isinstance(arg, ast.Name):
                    created = cpu_names.get(arg.id)
                if created is None:
                    continue
                yield self.finding(
                    source, arg,
                    f"`{source.segment(arg)}` is a CPU tensor (created without `device=`, line {created}) "
                    f"passed to `{op}` on a group initialised with backends for cuda only (line {init_line}), "
                    "so it has no backend for CPU tensors",
                    fix=Fix(message="create the tensor on the rank's GPU (`device=...`), or initialise with "
                                    "backend=\"cpu:gloo,cuda:nccl\""),
                )
                break


def _nccl_only_init(source: SourceFile) -> int | None:
    for call in source.calls:
        qual = source.resolve(call.func) or ""
        if not qual.endswith("init_process_group") or not qual.startswith("torch.distributed"):
            continue
        backend = keyword(call, "backend")
        value = backend.value if backend else (call.args[0] if call.args else None)
        if value is not None and _cuda_only(value):
            return call.lineno
    return None


def _cuda_only(node: ast.expr) -> bool:
    """A backend string that registers backends for `cuda` only: `"nccl"`, `"cuda:nccl"`, `"cuda:gloo"`
    (the CPU stand-in for NCCL), or a conditional choosing between such strings."""
    if isinstance(node, ast.IfExp):
        return _cuda_only(node.body) and _cuda_only(node.orelse)
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    value = node.value.strip().lower()
    if value == "nccl":
        return True
    parts = [part.split(":", 1) for part in value.split(",")]
    return all(len(part) == 2 and part[0].strip() == "cuda" for part in parts)


def _cpu_factory_line(source: SourceFile, node: ast.expr) -> int | None:
    if not isinstance(node, ast.Call) or keyword(node, "device") is not None:
        return None
    qual = source.resolve(node.func) or ""
    head, _, name = qual.rpartition(".")
    if head == "torch" and name in FACTORIES:
        return node.lineno
    return None


def _cpu_tensor_names(source: SourceFile) -> dict[str, int]:
    """Names bound exactly once in the file, to a CPU tensor factory call."""
    bound: dict[str, list[int | None]] = {}
    for stmt in statements(source.tree.body):
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(_cpu_factory_line(source, stmt.value))
        elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign, ast.For)) and isinstance(stmt.target, ast.Name):
            bound.setdefault(stmt.target.id, []).append(None)
    return {name: lines[0] for name, lines in bound.items() if len(lines) == 1 and lines[0] is not None}
