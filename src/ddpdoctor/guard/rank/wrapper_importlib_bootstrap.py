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
from sys import _getframe
from threading import get_ident
from time import monotonic
from typing import TYPE_CHECKING, Any

from ..fingerprint import CollectiveFingerprint, EnteredFingerprint
from ..judge.flight_files import FIRST_HEADER, HEADER, HEADER_STRIDE
from .call_ring import MASK

if TYPE_CHECKING:
    from .runtime import GuardRuntime

# Set while the guard's own code, or a guarded call, runs: the calls torch makes inside it (an object
# collective's all_gather, the remedy's) pass straight through. The main thread's flag is the one item of
# a module-global list (`_main_inside[0]`): a `threading.local` attribute costs some 100-180 ns to read or
# write, and the wrapper did both three times per call; a module global itself, rebound twice per call,
# cost some 200 instructions a write (a dict store) where a list item costs a few dozen. Other threads (an
# async checkpoint's) keep theirs in `local`.
local = threading.local()
_NOTHING: Any = object()  # no positional argument (the wrapper's `first`)
MAIN_THREAD = _MAIN_THREAD = threading.main_thread().ident
_main_inside = [False]
# The object that does the per-call work (ddpdoctor.guard.rank.runtime.GuardRuntime), or None when idle.
_runtime: GuardRuntime | None = None
# Bound once: `HEADER.pack_into(...)` binds a new method object on every call (a Struct's attributes are
# not looked up the way LOAD_METHOD skips binding), some 600 instructions of the hot path's 19,000.
_pack_header = HEADER.pack_into


def set_runtime(runtime: GuardRuntime | None) -> None:
    global _runtime
    _runtime = runtime


def pass_through(on: bool) -> None:
    """Let the calling thread's guarded calls pass straight through (the guard's own calls), or stop."""
    if get_ident() == _MAIN_THREAD:
        _main_inside[0] = on
    else:
        local.depth = on


# The names the body of torch's `_exception_logger` wrapper reads (torch 2.13): a tripwire, so that a torch
# whose decorator does more than log an error (a timer, a counter) keeps it on every call (`undecorated`).
_LOGGER_NAMES = ("Exception", "_get_msg_dict", "__name__", "_c10d_logger", "debug")


def undecorated(original: Callable[..., Any]) -> tuple[Callable[..., Any], Any]:
    """torch's function under its `_exception_logger` decorator, and that decorator's handling of an error on
    its own; or (original, None) where original is not so decorated.

    Why: the decorator is a Python frame taking `*args, **kwargs` (a tuple and a dict built, then a
    `f(*args, **kwargs)` call), some 2,000 instructions of a one-float gloo `all_reduce`, and all it does is
    log an error at debug level before re-raising it. The fast path calls the function under it and, only
    when that raises, runs the decorator itself around a function that raises the same error (`log_error`),
    so the log line, and any error the logging itself raises, are what they are without the guard. Not
    where the function under it is a `deprecated` wrapper: its warning's stacklevel counts the decorator's
    frame."""
    try:
        from torch.distributed.c10d_logger import _exception_logger
    except Exception:  # noqa: BLE001 - no torch, or another torch: the decorator stays
        return original, None
    code = getattr(original, "__code__", None)
    closure = getattr(original, "__closure__", None)
    if (
        code is None or code is not _exception_logger(undecorated).__code__ or code.co_names != _LOGGER_NAMES
        or code.co_freevars != ("func",) or not closure
    ):
        return original, None
    inner = closure[0].cell_contents
    if not callable(inner) or hasattr(inner, "__deprecated__"):
        return original, None
    held: list[BaseException] = []

    def again(*args: Any, **kwargs: Any) -> Any:
        raise held.pop()

    logged = _exception_logger(functools.wraps(inner)(again))  # `func.__name__` in its log: the op's

    def log_error(error: BaseException, args: tuple, kwargs: dict) -> BaseException:
        """What the decorator raises for `error` (it is logged): `error` itself, or the logging's own
        failure."""
        trace = error.__traceback__
        held.append(error)
        try:
            logged(*args, **kwargs)
        except BaseException as raised:  # noqa: BLE001 - handed back, raised by the caller
            held.clear()
            if raised is error:
                error.__traceback__ = trace  # as it was: without the frames of `logged` and `again`
            return raised
        return error  # not reached: `again` raises

    return inner, log_error


def make_wrapper(spec: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    # What the fast path calls: torch's function under its logging decorator (`undecorated`).
    inner, log_error = undecorated(original)
    # The line this wrapper's fast path took last, and its plan: a loop calls from one line again and again,
    # and two identity tests and an equality are cheaper than the key tuple, its hash and the dict lookup.
    # Valid while `runtime.fast` is the dict it was found in (hold_fast_path replaces it).
    last_code: Any = None
    last_lasti = -1
    last_plan: Any = None
    last_lines: Any = None

    @functools.wraps(original)
    def guarded(first: Any = _NOTHING, /, *rest: Any, **kwargs: Any) -> Any:
        # `first` apart (positional-only, so that no keyword clashes): the fast path tests and passes the
        # tensor of `all_reduce(x)` without indexing or slicing a tuple; the other paths put `args` together.
        nonlocal last_code, last_lasti, last_plan, last_lines
        runtime = _runtime
        if runtime is None:
            return original(*rest, **kwargs) if first is _NOTHING else original(first, *rest, **kwargs)
        if get_ident() != _MAIN_THREAD:
            return elsewhere(runtime, spec, original, rest if first is _NOTHING else (first, *rest), kwargs)
        if _main_inside[0]:
            return original(*rest, **kwargs) if first is _NOTHING else original(first, *rest, **kwargs)
        # The fast path: the main thread's same call again from a user's line (line_plan.py). What
        # `CallRecorder.before` and `after` (calls.py) do for it is written out here, so that a repeated call
        # runs one Python frame, not three (a frame's setup and teardown cost about as much as the
        # recording itself). Any other call takes `before`/`after`; the two must record alike.
        caller = _getframe(1)
        code = caller.f_code
        lasti = caller.f_lasti
        lines = runtime.fast  # only plans the fast path may take (CallRecorder.fast)
        # Any: `alike` below is true only for a plan, which mypy cannot follow
        plan: Any = last_plan
        if code is not last_code or lasti != last_lasti or lines is not last_lines:
            plan = lines.get((id(code), lasti))
            if plan is not None:
                if plan.spec is spec:
                    last_code, last_lasti, last_plan, last_lines = code, lasti, plan, lines
                else:
                    plan = None
        alike = False
        if plan is not None:
            try:  # identity first: arguments passed as the same objects again cost no `__eq__`
                alike = (first.__class__ is plan.cls and rest == plan.rest and kwargs == plan.kwargs
                         and first.shape == plan.shape and first.dtype is plan.dtype
                         and (first.is_cpu if plan.cpu else first.device == plan.device))
            except Exception:  # noqa: BLE001 - whatever a user passed, `before` judges it
                alike = False
        if not alike:  # `before` and `after`, in this frame: `before` finds the caller two frames up
            args = rest if first is _NOTHING else (first, *rest)
            call = runtime.before(spec, args, kwargs)
            if call is None:
                return original(*args, **kwargs)
            if call.__class__ is not CollectiveFingerprint:
                if isinstance(call, BaseException):  # F1: raised here, so the traceback ends in this frame
                    raise call
                return call(original, args, kwargs)  # a remedy: runs the collective its own way
            _main_inside[0] = True
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                _main_inside[0] = False
                runtime.failed(call, exc)
                raise
            _main_inside[0] = False
            runtime.after(call, result)
            return result
        # before(), for a call its line's plan describes: the sequence number, the fingerprint into the
        # ring and `current`, the flight slot
        try:
            info = plan.info
            raw = info.sequence()  # a fast plan's group has one (LinePlan.fast)
            seq = raw - info.offset
            if plan.renumbers:
                if spec.p2p:
                    seq = -1  # point-to-point: recorded, never matched with the group's collectives
                info.renumber_from = raw
                runtime.renumbering = (info, spec.name)
            now = monotonic()
            wall = now + runtime.wall_offset
            signature = plan.signature
            fp = EnteredFingerprint()  # index: set below, when the call is recorded
            fp.seq = seq
            fp.time = wall
            fp.signature = signature
            fp.state = "in"
            fp.metric = None
            # No call from here to `ring.count = index`, as in before()
            ring = runtime.ring
            index = fp.index = ring.count + 1
            runtime.entered = now
            runtime.current = fp
            ring.slots[index & MASK] = fp
            ring.count = index
        except Exception as exc:  # noqa: BLE001 - a guard bug must never break training
            runtime.fail_open(exc)
            return original(first, *rest, **kwargs)
        flight = runtime.flight
        if flight is not None:
            try:
                slot = index % flight.slots
                at = FIRST_HEADER + slot * HEADER_STRIDE  # the slot's header: its state byte is set after
                if flight.held[slot] is signature:
                    _pack_header(flight.map, at, b"E", index, seq, wall)
                else:
                    flight.enter(fp)
            except (OSError, ValueError) as exc:  # ValueError: the map was closed at exit by another thread
                runtime.flight = flight = None
                runtime.fail_open(exc, partial=True)
        _main_inside[0] = True
        try:
            # no `*`/`**` where there is nothing to spread: `f(*a, **k)` builds a new dict for every call
            if kwargs:
                result = inner(first, *rest, **kwargs)
            else:
                result = inner(first, *rest) if rest else inner(first)
        except BaseException as exc:
            if log_error is not None and isinstance(exc, Exception):
                raised = log_error(exc, (first, *rest), kwargs)  # what torch's decorator does with it
                if raised is not exc:
                    _main_inside[0] = False
                    runtime.failed(fp, raised)
                    raise raised  # noqa: B904 - its context is `exc` already, as under the decorator
            _main_inside[0] = False
            runtime.failed(fp, exc)
            raise
        _main_inside[0] = False
        # after(), for the main thread's call. `current` is this call: set above, and no other call of this
        # thread is recorded while it runs (they pass straight through).
        runtime.current = None
        if runtime.renumbering is not None:
            runtime._renumbered()
        if runtime.pending:
            runtime.async_work.drain()
        if (result is not None or signature.on_gpu) and runtime.async_work.track(fp, result, monotonic):
            return result
        fp.state = "done"
        if flight is not None:  # the entry's: `at` is its slot's header
            try:
                flight.map[at] = 68  # b"D"
            except (OSError, ValueError):  # ValueError: the map was closed at exit by another thread
                runtime.flight = None
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
