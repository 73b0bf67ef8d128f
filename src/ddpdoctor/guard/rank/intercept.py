"""Interception of torch.distributed's public collectives and point-to-point ops.

Each function object of `torch.distributed.distributed_c10d` listed in `GUARDED_OPS` is replaced by a
wrapper in that module, in `torch.distributed`, and in every already-imported module that bound the
original under some name (`from torch.distributed import all_reduce`): `rebind()` walks `sys.modules`
once at install time and swaps any attribute that *is* an original function. Modules imported later
get the wrapper through the patched `torch.distributed` namespace. Collectives issued from C++ (DDP's
gradient buckets) never pass through Python; they are counted by the process group's own sequence
number (`ProcessGroup._get_sequence_number_for_group`), which every fingerprint carries. The wrapper
itself is in wrapper_importlib_bootstrap.py (its file name keeps torch's warnings pointing at the caller).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

from ...collectives import BY_NAME, TORCH_DISTRIBUTED, Kind
from ...failsafe import failsafe
from ..fingerprint import P2P_OPS, RENUMBERED_OPS
from .wrapper_importlib_bootstrap import make_wrapper
from .wrapper_importlib_bootstrap import set_runtime as set_runtime  # the runtime installs itself here

# Every op of the shared table but the group-forming ones (`init_process_group`, `new_group`,
# `new_subgroups`): they run over the store before the group exists, so there is nothing to fingerprint.
GUARDED_OPS = tuple(op.name for op in TORCH_DISTRIBUTED if op.kind is not Kind.GROUP)
_GROUP_RANK_PARAMS = frozenset({"group_src", "group_dst"})  # a rank within the group, not a global one


def role_of(op: str, param: str) -> str:
    """"in", "out", or "" (read and written in place, or a point-to-point buffer)."""
    tensor = BY_NAME[op].tensor(param) if op in BY_NAME else None
    return tensor.role.value if tensor is not None else ""


class OpSpec:
    """Where, in one function's signature, the arguments the fingerprint needs are."""

    __slots__ = (
        "name",
        "tensors",
        "group",
        "reduce_op",
        "roots",
        "default_root",
        "async_op",
        "compare_shapes",
        "renumbers",
        "p2p",
        "single",
    )

    def __init__(self, name: str, func: Callable[..., Any]) -> None:
        params = list(inspect.signature(func).parameters)

        def where(pname: str) -> tuple[int, str] | None:
            return (params.index(pname), pname) if pname in params else None

        self.name = name
        entry = BY_NAME[name]
        # (position in this torch's signature, name, whether every rank passes the same shape)
        self.tensors = [
            (params.index(t.name), t.name, t.shapes_agree) for t in entry.tensors if t.name in params
        ]
        self.group = where("group")
        self.reduce_op = where("op")
        # (position, name, whether it is a group rank): one root is named either way, and ranks that name it
        # differently (src=3 here, group_src=1 there) still agree
        self.roots = [(params.index(p), p, p in _GROUP_RANK_PARAMS) for p in entry.roots if p in params]
        self.default_root = 0 if entry.root_zero_by_default else None
        self.async_op = where("async_op")
        self.compare_shapes = entry.shapes_agree
        self.renumbers = name in RENUMBERED_OPS  # see fingerprint.RENUMBERED_OPS
        self.p2p = name in P2P_OPS
        # The one tensor argument of most ops (all_reduce, broadcast...): the hot path reads it with no loop
        self.single = self.tensors[0] if len(self.tensors) == 1 else None


def argument(args: tuple, kwargs: dict, at: tuple[int, str] | None) -> Any:
    if at is None:
        return None
    index, name = at
    if index < len(args):
        return args[index]
    return kwargs.get(name)


_originals: dict[str, Callable[..., Any]] = {}
_wrappers: dict[str, Callable[..., Any]] = {}


def patch(
    also: tuple[Mapping[str, Callable[..., Any]], Mapping[str, Callable[..., Any]]] | None = None,
) -> int:
    """Replace the collectives in torch.distributed and rebind copies elsewhere; returns names rebound.
    `also`: other functions the caller replaced (originals by name, their replacements), rebound in the
    same walk of every module (one walk costs a rank some 5-15 ms of its start)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in GUARDED_OPS:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        original = getattr(original, "__ddpdoctor_original__", original)
        if name not in _wrappers:
            _originals[name] = original
            _wrappers[name] = make_wrapper(OpSpec(name, original), original)
        setattr(c10d, name, _wrappers[name])
        current = getattr(dist, name, None)
        # Not over a user's own shim (`dist.all_reduce = counting_all_reduce`): it stays, and the original
        # it calls is reached through rebind() below when it holds it in a module global.
        if current is original or hasattr(current, "__ddpdoctor_original__"):
            setattr(dist, name, _wrappers[name])
    old, new = also or ({}, {})
    return rebind({**_originals, **old}, {**_wrappers, **new})


def unpatch() -> None:
    if not _originals:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name, original in _originals.items():
        setattr(c10d, name, original)
        if getattr(dist, name, None) is _wrappers.get(name):
            setattr(dist, name, original)
    rebind(_wrappers, _originals)


def rebind(old: dict[str, Callable[..., Any]], new: dict[str, Callable[..., Any]]) -> int:
    """Swap every module attribute that is one of `old`'s function objects for its `new` counterpart."""
    by_id = {id(func): new[name] for name, func in old.items()}
    wanted = set(by_id)
    count = 0
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        try:
            # the test runs in C: the thousand modules of a process with torch hold some 50,000 names,
            # and a walk of them all in Python cost every rank 10-15 ms of its start
            if wanted.isdisjoint(map(id, namespace.values())):
                continue
            items = list(namespace.items())
        except RuntimeError:  # a module mutating its namespace in another thread
            continue
        for attr, value in items:
            if callable(value) and id(value) in by_id:
                replacement = by_id[id(value)]
                if value is not replacement:
                    with failsafe("intercept.rebind"):  # read-only namespaces; not worth failing for
                        namespace[attr] = replacement
                        count += 1
    return count


def original(name: str) -> Callable[..., Any]:
    """The unwrapped function (for the guard's own calls and the remedy)."""
    if name in _originals:
        return _originals[name]
    import torch.distributed.distributed_c10d as c10d

    return getattr(c10d, name)
