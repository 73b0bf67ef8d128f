"""Fail-open: a failure of the guard's own code costs the program one warning, never its training. A
failure of the whole guard disables it; of a part (the flight file, GPU completion markers), that part."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ...failsafe import swallowed

if TYPE_CHECKING:
    from .calls import CallRecorder


def fail_open(runtime: CallRecorder, exc: BaseException, partial: bool = False) -> None:
    """One warning, then training goes on unguarded (or, `partial`, with less of the guard)."""
    swallowed("runtime.fail_open", exc)
    if runtime.disabled:
        return
    if not partial:
        runtime.disabled = True
        runtime.hold_fast_path()
    print(
        f"[ddpdoctor] warning: the guard {'lost a part' if partial else 'disabled itself'} "
        f"({type(exc).__name__}: {exc}); training continues {'with less' if partial else 'unguarded'}",
        file=sys.stderr,
        flush=True,
    )
    if not partial and runtime.monitor is not None:
        runtime.monitor.stop(exited=False, quiet=True)


@contextlib.contextmanager
def failing_open(runtime: CallRecorder) -> Iterator[None]:
    """Run a block of the guard's own work (not the hot path's: a `with` costs there) whose failure
    disables the guard, with one warning, instead of reaching the program."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - a guard bug must never break training
        fail_open(runtime, exc)
