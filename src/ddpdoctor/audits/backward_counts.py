"""How many backward passes this rank ran since its first sharded root was wrapped, and the user's line of
the last one (F11 sharded-step-divergence: every backward of a sharded model is a series of reduce-scatters,
and all-gathers where the forward resharded).

Counted at `torch.autograd.backward`, which `Tensor.backward()` calls (and through it accelerate's
`accelerator.backward`, DeepSpeed's `engine.backward`, Lightning's `manual_backward`): one wrapper call per
backward pass and nothing per forward. A module-level backward hook would cost every forward instead
(torch wraps the module's inputs and outputs in `BackwardHookFunction` nodes on each call;
`benchmarks/modern_costs.py` measures both). The count is the process's, not one module's: a backward that
never reaches the sharded model counts too, which only matters where ranks differ in such passes.

Installed by `sharded_passes.py` with the first sharded root, so a job without one pays nothing; read by
`forward_counts.snapshot()` into each root's `ModelPasses` (counted from 0 on every rank alike).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..callsite import is_user


class BackwardCount:
    __slots__ = ("backwards", "code", "lasti")

    def __init__(self) -> None:
        self.backwards = 0
        self.code: Any = None
        self.lasti = -1

    def note(self) -> None:
        """One backward pass begins: count it, and keep the user's frame that asked for it (as code and
        bytecode offset: no frame held, no line table read)."""
        self.backwards += 1
        try:
            frame: Any = sys._getframe(2)  # the wrapper's caller is `Tensor.backward`; its caller, the user
        except ValueError:
            return
        while frame is not None and not is_user(frame.f_code.co_filename):  # cached per file name
            frame = frame.f_back
        if frame is not None:
            self.code = frame.f_code
            self.lasti = frame.f_lasti


COUNT = BackwardCount()
_lock = threading.Lock()
_original: Callable[..., Any] | None = None


def count_backwards() -> None:
    """Wrap `torch.autograd.backward` (once per process)."""
    global _original
    import torch.autograd

    with _lock:
        if _original is not None:
            return
        original = torch.autograd.backward

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            COUNT.note()
            return original(*args, **kwargs)

        _original = original
        torch.autograd.backward = backward


def forget() -> None:
    """Unwrap and reset (the guard's uninstall, tests)."""
    global _original
    import torch.autograd

    with _lock:
        if _original is not None:
            torch.autograd.backward = _original
            _original = None
        COUNT.backwards = 0
        COUNT.code = None
        COUNT.lasti = -1


def last_site() -> tuple[str, int | None] | None:
    from .forward_counts import line_of

    code = COUNT.code
    if code is None:
        return None
    return code.co_filename, line_of(code, COUNT.lasti)
