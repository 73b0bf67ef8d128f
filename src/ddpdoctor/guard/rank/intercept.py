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
from collections.abc import Callable
from typing import Any

from ..failsafe import failsafe
from ..fingerprint import P2P_OPS, RENUMBERED_OPS
from .wrapper_importlib_bootstrap import local, make_wrapper
from .wrapper_importlib_bootstrap import set_runtime as set_runtime  # the runtime installs itself here

GUARDED_OPS = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "_all_gather_base",
    "all_gather_coalesced",
    "all_gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "send_object_list",
    "recv_object_list",
)

# Parameters that carry tensors; the second set are those whose shapes need not agree across ranks.
_TENSOR_PARAMS = (
    "tensor",
    "tensors",
    "tensor_list",
    "output_tensor_list",
    "input_tensor_list",
    "output_tensor_lists",
    "output",
    "input",
    "output_tensor",
    "input_tensor",
    "input_list",
    "gather_list",
    "scatter_list",
)
_RANK_LOCAL_PARAMS = frozenset({"gather_list", "scatter_list"})
# This rank's own piece of a list collective: NCCL takes uneven pieces (all_gather's input sized as this
# rank's entry of the output list), so only the list, the same on every rank, is compared.
_RANK_LOCAL_PIECES = frozenset({("all_gather", "tensor"), ("reduce_scatter", "output")})
_UNEVEN_OPS = frozenset({"all_to_all", "all_to_all_single"})
# Which tensors a call reads and which it fills, for the report (`all_gather out [1] [1] float32`); a
# tensor that is both (all_reduce's) is not labelled.
_OUTPUT_PARAMS = frozenset({"output_tensor_list", "output_tensor_lists", "output", "output_tensor"})
_INPUT_PARAMS = frozenset({"input_tensor_list", "input", "input_tensor", "input_list"})
_TENSOR_ROLE = {
    ("all_gather", "tensor_list"): "out",
    ("gather", "tensor"): "in",
    ("scatter", "tensor"): "out",
}


def role_of(op: str, param: str) -> str:
    """"in", "out", or "" (read and written in place, or a point-to-point buffer)."""
    if param in _OUTPUT_PARAMS:
        return "out"
    if param in _INPUT_PARAMS:
        return "in"
    return _TENSOR_ROLE.get((op, param), "")
_ROOT_PARAMS = ("src", "dst", "group_src", "group_dst")
_GROUP_RANK_PARAMS = frozenset({"group_src", "group_dst"})  # a rank within the group, not a global one
# Ops whose root, when the call names none, is global rank 0 (torch sets `src = 0` / `dst = 0`): a rank
# that omits it and one that says dst=0 make the same call.
_ROOT_ZERO_BY_DEFAULT = frozenset(
    {"gather", "scatter", "gather_object", "broadcast_object_list", "scatter_object_list"}
)


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
    )

    def __init__(self, name: str, func: Callable[..., Any]) -> None:
        params = list(inspect.signature(func).parameters)

        def where(pname: str) -> tuple[int, str] | None:
            return (params.index(pname), pname) if pname in params else None

        self.name = name
        self.tensors = [
            (params.index(p), p, p not in _RANK_LOCAL_PARAMS and (name, p) not in _RANK_LOCAL_PIECES)
            for p in _TENSOR_PARAMS
            if p in params
        ]
        self.group = where("group")
        self.reduce_op = where("op")
        # (position, name, whether it is a group rank): one root is named either way, and ranks that name it
        # differently (src=3 here, group_src=1 there) still agree
        self.roots = [(params.index(p), p, p in _GROUP_RANK_PARAMS) for p in _ROOT_PARAMS if p in params]
        self.default_root = 0 if name in _ROOT_ZERO_BY_DEFAULT else None
        self.async_op = where("async_op")
        self.compare_shapes = name not in _UNEVEN_OPS
        self.renumbers = name in RENUMBERED_OPS  # see fingerprint.RENUMBERED_OPS
        self.p2p = name in P2P_OPS


def argument(args: tuple, kwargs: dict, at: tuple[int, str] | None) -> Any:
    if at is None:
        return None
    index, name = at
    if index < len(args):
        return args[index]
    return kwargs.get(name)


_originals: dict[str, Callable[..., Any]] = {}
_wrappers: dict[str, Callable[..., Any]] = {}
_local = local  # the guard's own calls set `_local.depth` so that they pass straight through


def patch() -> int:
    """Replace the collectives in torch.distributed and rebind copies elsewhere; returns names rebound."""
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
    return rebind(_originals, _wrappers)


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
    count = 0
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        try:
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
