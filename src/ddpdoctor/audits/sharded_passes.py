"""F11 sharded-step-divergence: count the forward passes of every sharded root (forward_counts.py), and the
process's backward passes from the first one on (backward_counts.py).

Patched: `FSDPState.init` (what `fully_shard` calls once it has made a module's state: our pre-hook then goes
in front of FSDP2's own, which all-gathers) and `FullyShardedDataParallel.__init__` (the outermost one: FSDP's
auto-wrap constructs the inner ones inside it). `fully_shard` is applied bottom-up, so each later call on a
module that contains earlier ones takes the count over (`count_forwards`).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..failsafe import failsafe
from ..findings import Finding
from . import backward_counts
from .forward_counts import count_forwards
from .patching import Uninstall, all_of, patch

_inside = threading.local()


def _after(original: Callable[..., Any], count: Callable[[tuple[Any, ...]], object]) -> Any:
    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        outermost = not getattr(_inside, "active", False)
        _inside.active = True
        try:
            result = original(*args, **kwargs)
        finally:
            if outermost:
                _inside.active = False
        if outermost:
            with failsafe("sharded_passes: counting a root's forward passes"):
                count(args)
        return result

    return wrapped


def _count_fsdp(args: tuple[Any, ...]) -> None:
    count_forwards(args[0], "FullyShardedDataParallel")
    backward_counts.count_backwards()


def install_sharded_pass_counts(report: Callable[[Finding], None]) -> Uninstall:
    removers: list[Uninstall] = []
    state_module = sys.modules.get("torch.distributed.fsdp._fully_shard._fsdp_state")
    if state_module is not None and hasattr(state_module, "FSDPState"):

        def fully_shard(args: tuple[Any, ...]) -> None:
            modules: Any = args[1] if len(args) > 1 else ()
            if len(modules) == 1:  # one module per call (a list of modules shares one state: no root)
                count_forwards(modules[0], "fully_shard")
                backward_counts.count_backwards()

        removers.append(patch(state_module.FSDPState, "init", lambda f: _after(f, fully_shard)))
    fsdp = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    if fsdp is not None:
        removers.append(
            patch(
                fsdp.FullyShardedDataParallel,
                "__init__",
                lambda f: _after(f, _count_fsdp),
            )
        )
    removers.append(backward_counts.forget)
    return all_of(removers)
