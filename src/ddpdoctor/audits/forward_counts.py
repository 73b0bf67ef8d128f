"""How many forward passes each wrapped root module ran on this rank, and the user's line of the last one.

A forward pre-hook on the root only (the module given to DDP, the outermost `fully_shard` / FSDP), put
first so that it counts a pass before FSDP's own pre-forward all-gathers: a rank stuck in that all-gather
has counted the pass it is stuck in. Per forward: one increment and a walk of two or three frames to the
caller's line (`benchmarks/guard_overhead.py` measures it). Read by the monitor when ranks stall
(`snapshot`), and by the replica digests (replicas.py) as the step they were taken at.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

from ..guard.model import ModelPasses

_TORCH_MODULE_FILE = ("torch/nn/modules/module.py", "torch\\nn\\modules\\module.py")


class ForwardCounter:
    __slots__ = ("name", "wrapper", "forwards", "code", "line", "handle", "__weakref__")

    def __init__(self, name: str, wrapper: str) -> None:
        self.name = name
        self.wrapper = wrapper
        self.forwards = 0
        self.code: Any = None
        self.line = 0
        self.handle: Any = None

    def __call__(self, module: Any, args: Any) -> None:
        self.forwards += 1
        frame: Any = sys._getframe(1)
        # up through torch's Module.__call__ machinery to the caller (kept as code and line: no frame held)
        while frame is not None and frame.f_code.co_filename.endswith(_TORCH_MODULE_FILE):
            frame = frame.f_back
        if frame is not None:
            self.code, self.line = frame.f_code, frame.f_lineno

    def count(self) -> ModelPasses:
        path = self.code.co_filename if self.code is not None else None
        return ModelPasses(self.name, self.wrapper, self.forwards, path, self.line or None)


_lock = threading.Lock()
_counters: weakref.WeakKeyDictionary[Any, ForwardCounter] = weakref.WeakKeyDictionary()


def count_forwards(module: Any, wrapper: str) -> ForwardCounter:
    """Count `module`'s forward passes (once per module). Roots wrapped earlier that `module` contains
    stop counting: FSDP2 is applied bottom-up, and only the outermost module is the user's `model(...)`."""
    with _lock:
        existing = _counters.get(module)
        if existing is not None:
            return existing
        inner = {id(m) for m in module.modules()}
        for other, counter in list(_counters.items()):
            if id(other) in inner and other is not module:
                counter.handle.remove()
                del _counters[other]
        counter = ForwardCounter(type(module).__name__, wrapper)
        counter.handle = module.register_forward_pre_hook(counter, prepend=True)
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
