"""The wrapper that stands in for each guarded torch.distributed function (see intercept.py).

Why this file name: a warning torch raises inside a collective (a deprecation, `monitored_barrier`'s)
uses `stacklevel` to point at the line that called it. The wrapper adds a frame, so the warning would
point here, and users would read it as ddpdoctor calling a deprecated function; the once-per-location
filter would also fold every call site into one. CPython's warnings machinery skips, when it counts
`stacklevel`, every frame whose file name contains both "importlib" and "_bootstrap" (that is how
importlib keeps its own frames out of warnings, in the C and the Python implementation alike). So the
wrapper lives in a file so named, and a warning points at the user's line as it does without the guard.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from threading import get_ident
from typing import TYPE_CHECKING, Any

from ..fingerprint import CollectiveFingerprint

if TYPE_CHECKING:
    from .runtime import GuardRuntime

# Set while the guard's own code, or a guarded call, runs: the calls torch makes inside it (an object
# collective's all_gather, the remedy's) pass straight through. The main thread's flag is a module global
# (`_main_inside`): a `threading.local` attribute costs some 100-180 ns to read or write, and the wrapper
# did both three times per call; other threads (an async checkpoint's) keep theirs in `local`.
local = threading.local()
_MAIN_THREAD = threading.main_thread().ident
_main_inside = False
# The object that does the per-call work (ddpdoctor.guard.rank.runtime.GuardRuntime), or None when idle.
_runtime: GuardRuntime | None = None


def set_runtime(runtime: GuardRuntime | None) -> None:
    global _runtime
    _runtime = runtime


def pass_through(on: bool) -> None:
    """Let the calling thread's guarded calls pass straight through (the guard's own calls), or stop."""
    global _main_inside
    if get_ident() == _MAIN_THREAD:
        _main_inside = on
    else:
        local.depth = on


def make_wrapper(spec: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        global _main_inside
        runtime = _runtime
        if runtime is None:
            return original(*args, **kwargs)
        if get_ident() != _MAIN_THREAD:
            return elsewhere(runtime, spec, original, args, kwargs)
        if _main_inside:
            return original(*args, **kwargs)
        call = runtime.before(spec, args, kwargs)
        if call is None:
            return original(*args, **kwargs)
        if call.__class__ is not CollectiveFingerprint:
            if isinstance(call, BaseException):  # F1: raised here so the traceback ends in one guard frame
                raise call
            return call(original, args, kwargs)  # a remedy: runs the collective its own way
        _main_inside = True
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            _main_inside = False
            runtime.failed(call, exc)
            raise
        _main_inside = False
        runtime.after(call, result)
        return result

    guarded.__ddpdoctor_original__ = original  # type: ignore[attr-defined]
    return guarded


def elsewhere(
    runtime: GuardRuntime, spec: Any, original: Callable[..., Any], args: tuple, kwargs: dict
) -> Any:
    """The wrapper's work for a call from a thread other than the main one: the same, its flag in `local`."""
    if getattr(local, "depth", False):
        return original(*args, **kwargs)
    call = runtime.before(spec, args, kwargs)
    if call is None:
        return original(*args, **kwargs)
    if call.__class__ is not CollectiveFingerprint:
        if isinstance(call, BaseException):
            raise call
        return call(original, args, kwargs)
    local.depth = True
    try:
        result = original(*args, **kwargs)
    except BaseException as exc:
        local.depth = False
        runtime.failed(call, exc)
        raise
    local.depth = False
    runtime.after(call, result)
    return result
