"""How many forward passes each wrapped root module ran on this rank, and the user's line of the last one.

A forward pre-hook on the root only (the module given to DDP, the outermost `fully_shard` / FSDP), put
first so that it counts a pass before FSDP's own pre-forward all-gathers: a rank stuck in that all-gather
has counted the pass it is stuck in. Per forward: one increment, the caller's frame four levels up and its
bytecode offset (`benchmarks/modern_costs.py` measures it). Read by the monitor with each heartbeat
(`snapshot`, with the process's backward count from backward_counts.py), and by the replica digests
(replicas.py) as the step they were taken at.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

from ..records import ModelPasses
from . import backward_counts


def _torch_call_machinery() -> frozenset[int]:
    """The ids of the code objects of torch's `Module.__call__` machinery (`_wrapped_call_impl`,
    `_call_impl` and the functions nested in it): permanent objects, so their ids are never reused."""
    import types

    import torch

    out = set()
    for name in ("_wrapped_call_impl", "_call_impl"):
        code = getattr(getattr(torch.nn.Module, name, None), "__code__", None)
        if code is not None:
            out.add(id(code))
            out.update(id(c) for c in code.co_consts if isinstance(c, types.CodeType))
    return frozenset(out)


_TORCH_CALL: frozenset[int] = frozenset()


class ForwardCounter:
    __slots__ = ("name", "wrapper", "forwards", "code", "lasti", "handle", "__weakref__")

    def __init__(self, name: str, wrapper: str) -> None:
        self.name = name
        self.wrapper = wrapper
        self.forwards = 0
        self.code: Any = None
        self.lasti = -1
        self.handle: Any = None

    def hook(self, module: Any, args: Any) -> None:
        self.forwards += 1
        # The caller of `model(...)`: torch calls a forward pre-hook from `inner` in `_call_impl` in
        # `_wrapped_call_impl` (torch 2.x), so it is 4 frames up; where another layer of torch's sits in
        # between, walk on. Kept as code and bytecode offset (the line is worked out when asked): no frame
        # held, no line table read per pass.
        try:
            frame: Any = sys._getframe(4)
        except ValueError:
            return
        while frame is not None and id(frame.f_code) in _TORCH_CALL:  # ids: hashing a code object is slow
            frame = frame.f_back
        if frame is not None:
            self.code = frame.f_code
            self.lasti = frame.f_lasti

    def count(self) -> ModelPasses:
        code = self.code
        path, line = (code.co_filename, line_of(code, self.lasti)) if code is not None else (None, None)
        backwards = backward_counts.COUNT.backwards
        if not backwards:
            return ModelPasses(self.name, self.wrapper, self.forwards, path, line)
        site = backward_counts.last_site()
        return ModelPasses(self.name, self.wrapper, self.forwards, path, line, backwards,
                           site[0] if site else None, site[1] if site else None)


def line_of(code: Any, lasti: int) -> int | None:
    """The source line of a bytecode offset (what `frame.f_lineno` would have said)."""
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return int(line) if line is not None else None
    return None


_lock = threading.Lock()
_counters: weakref.WeakKeyDictionary[Any, ForwardCounter] = weakref.WeakKeyDictionary()


def count_forwards(module: Any, wrapper: str) -> ForwardCounter:
    """Count `module`'s forward passes (once per module). Roots wrapped earlier that `module` contains
    stop counting: FSDP2 is applied bottom-up, and only the outermost module is the user's `model(...)`."""
    global _TORCH_CALL
    with _lock:
        if not _TORCH_CALL:
            _TORCH_CALL = _torch_call_machinery()
        existing = _counters.get(module)
        if existing is not None:
            return existing
        inner = {id(m) for m in module.modules()}
        for other, counter in list(_counters.items()):
            if id(other) in inner and other is not module:
                counter.handle.remove()
                del _counters[other]
        counter = ForwardCounter(type(module).__name__, wrapper)
        counter.handle = module.register_forward_pre_hook(counter.hook, prepend=True)
        _counters[module] = counter
        return counter


def counter_of(module: Any) -> ForwardCounter | None:
    return _counters.get(module)


def snapshot() -> tuple[ModelPasses, ...]:
    """Every counted root's passes now (any thread)."""
    with _lock:
        counters = list(_counters.values())
    return tuple(counter.count() for counter in counters)


def forget_all() -> None:
    with _lock:
        for counter in _counters.values():
            counter.handle.remove()
        _counters.clear()
