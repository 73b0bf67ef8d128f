"""What a user's line that called a collective passed last time, and what the guard made of it: the hot
path's shortcut for the line issuing the same call again (docs/guard.md, "Per call").

A training loop calls the same collective from the same line with the same arguments, only the tensor's
contents changing. The first call from a line is described in full (argument parsing, F1's device check,
the call site, the interned signature); the plan keeps the result. A later call from that line reuses it
when the plan's identity test passes: the same op; the same default group; for an op whose one tensor comes
first and positionally (all_reduce, broadcast, send...), the other arguments equal to those of last time
(compared identity first: the same objects again cost no `__eq__`) and a tensor of the same class, shape,
dtype and device. Other calls (several tensors, lists, a tensor by keyword) are matched on what the general
path parses: op, group, reduce op, root and the tensors' metadata.
"""

from __future__ import annotations

from typing import Any

from ..fingerprint import CollectiveSignature
from .groups import GroupInfo
from .intercept import OpSpec


class LinePlan:
    """One line's last call. `cls` is None where the identity test does not apply (the general path's
    comparison of `reduce_op`, `root` and `metas` still does)."""

    __slots__ = (
        "spec", "info", "group", "default", "reduce_op", "root", "metas", "signature", "code", "barrier",
        "cls", "rest", "kwargs", "shape", "dtype", "device", "cpu", "fast", "renumbers",
    )

    def __init__(self, spec: OpSpec, info: GroupInfo, default: Any, reduce_op: str | None, root: Any,
                 metas: tuple, signature: CollectiveSignature, code: Any, args: tuple, kwargs: dict) -> None:
        self.spec = spec
        self.info = info
        self.group = info.group
        self.default = default  # the default group then: a new one (destroy, init again) voids the plan
        self.reduce_op = reduce_op
        self.root = root
        self.metas = metas
        self.signature = signature
        self.code = code  # kept so that its id, the plan's key, is never reused while the plan lives
        self.barrier = spec.name == "barrier" and bool(info.device_types)  # barrier_mismatch runs every time
        self.cls: Any = None  # Any: a test of `value.__class__ is cls` would narrow `value` to `object`
        self.rest: tuple = ()
        self.kwargs: dict = {}
        self.shape = self.dtype = self.device = None
        self.cpu = False
        single = spec.single
        first = args[0] if args else None
        if (
            single is not None and single[0] == 0 and first is not None
            and not isinstance(first, (list, tuple)) and getattr(first, "device", None) is not None
            and not any(_tensor_like(v) for v in (*args[1:], *kwargs.values()))
        ):
            self.cls = first.__class__
            self.rest = args[1:]
            self.kwargs = dict(kwargs)
            self.shape, self.dtype, self.device = first.shape, first.dtype, first.device
            # A CPU tensor's device is `cpu` whatever it was made with (`cpu:0` too): the fast path asks
            # `is_cpu`, which makes no Device object
            self.cpu = first.device.type == "cpu"
        # Whether the wrapper's fast path takes this line's repeats (wrapper_importlib_bootstrap.py): the
        # identity test applies, no per-call check remains (barrier_mismatch) and the group numbers its calls
        # (the fast path calls `info.sequence` unconditionally).
        self.fast = self.cls is not None and not self.barrier and info.sequence is not None
        self.renumbers = spec.renumbers  # what the fast path does around a renumbered op: one test for all


def _tensor_like(value: Any) -> bool:
    """A tensor (or a list of them) among the other arguments: compared by `==`, it would be elementwise."""
    return getattr(value, "device", None) is not None or isinstance(value, (list, tuple, dict))
