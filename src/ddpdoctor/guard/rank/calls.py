"""The hot path: `before`/`after`/`failed` run in the caller's thread for every guarded collective and
must stay cheap (docs/guard.md, "Overhead and detection time"). They check F1, record the call (its interned
signature, found by the calling line; a fingerprint in the call ring) and write the flight-file slot.
Nothing here talks to the store, compares anything across ranks or builds text; the monitor thread does
that.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from threading import get_ident as _thread_id
from typing import Any

from ...callsite import USER_KIND, call_sites, known_frame, known_kind
from ...findings import Finding
from ..config import GuardConfig
from ..fingerprint import CollectiveFingerprint
from ..judge.flight_files import FIRST_HEADER, HEADER, HEADER_STRIDE
from . import fail_open, intercept
from .backend_mismatch import barrier_mismatch, respond
from .call_ring import MASK, CallRing
from .catching import caught_by_program
from .consensus import ChainCheck
from .flight import FlightFile
from .groups import GroupInfo, never_issued, reduce_op_name
from .lightning_metrics import metric_in_stack
from .line_plan import LinePlan
from .pending import PendingWork
from .signatures import Signatures
from .wrapper_importlib_bootstrap import MAIN_THREAD as _MAIN_THREAD

_LIGHTNING = ("lightning", "pytorch_lightning")
NOT_A_RANK = object()  # a root argument torch will refuse with its own error
_new = object.__new__
_pack_header = HEADER.pack_into  # bound once (see wrapper_importlib_bootstrap.py)
MAX_LINES = 4096  # user lines whose last call is kept (CallRecorder.by_line)


def scan_nested(value: Any, compared: bool, metas: list) -> None:
    """`before`'s tensor loop for a list argument (gather lists; all_gather_coalesced's lists of lists):
    appends each tensor's metadata."""
    for item in value:
        for tensor in item if isinstance(item, (list, tuple)) else (item,):
            device = getattr(tensor, "device", None)
            if device is not None:
                # rank-local tensors (gather_list, scatter_list) need not agree: device only
                metas.append((tensor.shape, tensor.dtype, device) if compared else device)


def tensors_of(spec: intercept.OpSpec, args: tuple, kwargs: dict) -> Iterator[Any]:
    """Every tensor a call passes, in the order `before` records their metadata."""
    for index, name, _ in spec.tensors:
        value = args[index] if index < len(args) else kwargs.get(name)
        if value is None:
            continue
        for item in value if isinstance(value, (list, tuple)) else (value,):
            for tensor in item if isinstance(item, (list, tuple)) else (item,):
                if getattr(tensor, "device", None) is not None:
                    yield tensor


def bad_device(spec: intercept.OpSpec, args: tuple, kwargs: dict, info: GroupInfo) -> Any:
    """F1: the first tensor on a device the group has no backend for, or None (also where the group's
    backends are unknown)."""
    types = info.device_types
    if not types:
        return None
    ok = info.devices_ok
    for tensor in tensors_of(spec, args, kwargs):
        device = tensor.device
        if device not in ok:
            if device.type not in types:
                return tensor
            ok.add(device)
    return None


def root_of(spec: intercept.OpSpec, args: tuple, kwargs: dict, info: GroupInfo) -> Any:
    """The global rank a rooted call names (`src=`, `dst=`, `group_src=`...), or NOT_A_RANK."""
    for index, name, group_rank in spec.roots:
        value = args[index] if index < len(args) else kwargs.get(name)
        if value is not None:
            if value.__class__ is not int:
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    return NOT_A_RANK
            return info.global_rank(value) if group_rank else value
    return spec.default_root


class CallRecorder:
    """Per-call bookkeeping of one rank: what it is in, what it issued, what it left unfinished."""

    # Defined by GuardRuntime: keep one of this rank's own findings.
    record_finding: Callable[[Finding], None]
    caught: bool

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.ring = CallRing(config.ring_size)  # every call, by index: history and the chain's input
        self.current: CollectiveFingerprint | None = None  # the main thread's call in progress
        self.entered = 0.0
        self.side: dict[CollectiveFingerprint, float] = {}  # other threads' calls in progress, and since when
        # One clock read per collective: wall time is the monotonic one plus this (the drift of a wall
        # clock slewed by NTP over a job is milliseconds, below what a report shows).
        self.wall_offset = time.time() - time.monotonic()
        self.rank: int | None = None
        self.flight: FlightFile | None = None
        self.groups: dict[Any, GroupInfo] = {}
        self.signatures = Signatures()
        # (id(code), instruction) of a user's line that called a collective -> what it passed last time and
        # what the guard made of it (line_plan.py)
        self.by_line: dict[tuple[int, int], LinePlan] = {}
        # The plans the wrapper's fast path may take by itself (wrapper_importlib_bootstrap.py): those of
        # `by_line` that are `fast`, made or last taken on the main thread for the current default group.
        # Whatever voids that (the guard disabled or paused, a new default group, `by_line` cleared) puts a
        # new empty dict here (`hold_fast_path`), so the fast path tests one thing, not five.
        self.fast: dict[tuple[int, int], LinePlan] = {}
        self.async_work = PendingWork(self._done, self.fail_open)
        self.pending = self.async_work.queue  # tested on every call: one attribute away
        self.default_group: Any = None
        self.monitor: Any = None
        self.disabled = False
        self.paused: Any = None  # the monitor, stopped by a post-mortem that decided nothing
        self.main_thread_id: int | None = None
        self.chain = ChainCheck(0)
        self.renumbering: tuple[GroupInfo, str] | None = None  # a fingerprint.RENUMBERED_OPS op in progress

    def info(self, group: Any) -> GroupInfo:
        info = self.groups.get(group)
        if info is None:
            info = self.groups[group] = GroupInfo(group)
        return info

    def hold_fast_path(self) -> None:
        """Void every plan the wrapper's fast path holds: the next call of each line goes through `before`,
        which puts it back while the guard records normally. Called where the guard is disabled or paused,
        the default group changes and `by_line` is cleared."""
        self.fast = {}

    def fail_open(self, exc: BaseException, partial: bool = False) -> None:
        fail_open.fail_open(self, exc, partial)

    def failing_open(self) -> AbstractContextManager[None]:
        return fail_open.failing_open(self)

    # One function on purpose, longer than the guard's 60-line limit: split in three (the tensor loop, the
    # entry bookkeeping) it measured 2-6 % slower per call (0.1-0.3 µs) where the A/A noise was 1.4 %.
    def before(self, spec: intercept.OpSpec, args: tuple, kwargs: dict) -> Any:
        if self.disabled:
            return None
        if self.paused is not None:  # the program caught a collective's error and goes on
            monitor, self.paused = self.paused, None
            monitor.resume()
        try:
            # The calling line's plan (line_plan.py): the same call as last time from the user's own line
            # takes its group, signature and checks from there, with no argument parsing and no frame walk.
            caller = sys._getframe(2)
            plan = self.by_line.get((id(caller.f_code), caller.f_lasti))
            value: Any = args[0] if args else None
            same: LinePlan | None = None
            if (
                plan is not None and plan.spec is spec and value.__class__ is plan.cls
                and plan.default is self.default_group
            ):
                try:  # identity first: arguments passed as the same objects again cost no `__eq__`
                    alike = args[1:] == plan.rest and kwargs == plan.kwargs
                except Exception:  # noqa: BLE001 - whatever a user passed, the general path judges it
                    alike = False
                if (alike and value.shape == plan.shape and value.dtype is plan.dtype
                        and value.device == plan.device):
                    same = plan
            if same is not None:
                if same.fast and self.main_thread_id == _MAIN_THREAD == _thread_id():
                    self.fast[(id(caller.f_code), caller.f_lasti)] = same  # back after a pause
                info = same.info
                group = same.group
                raw = info.sequence() if info.sequence is not None else -1
                # F1's devices are those the line passed when the plan was made (it is made only then)
                signature = same.signature
                library = None
                bad = barrier_mismatch(group, args, kwargs, info.device_types) if same.barrier else None
            else:
                at = spec.group  # (position, name) of the group parameter; inlined intercept.argument
                group = None if at is None else args[at[0]] if at[0] < len(args) else kwargs.get(at[1])
                if group is None:
                    group = self.default_group
                    if group is None:
                        return None  # no group yet: torch raises its own (F9) error
                info = self.groups.get(group) or self.info(group)
                if not info.member:
                    return None
                # The tensors' metadata, as torch hands it out (hashable, nothing converted): with the call
                # site, the key of this call's interned signature.
                single = spec.single
                if single is not None:  # one tensor argument: the common case, inlined
                    value = args[single[0]] if single[0] < len(args) else kwargs.get(single[1])
                    if value is None:
                        metas: tuple = ()
                    elif isinstance(value, (list, tuple)):
                        found: list = []
                        scan_nested(value, single[2], found)
                        metas = tuple(found)
                    else:
                        device = getattr(value, "device", None)
                        if device is None:
                            metas = ()
                        else:
                            metas = ((value.shape, value.dtype, device) if single[2] else device,)
                else:
                    found = []
                    for index, name, compared in spec.tensors:
                        value = args[index] if index < len(args) else kwargs.get(name)
                        if value is None:
                            continue
                        if isinstance(value, (list, tuple)):
                            scan_nested(value, compared, found)
                            continue
                        device = getattr(value, "device", None)
                        if device is not None:
                            found.append((value.shape, value.dtype, device) if compared else device)
                    metas = tuple(found)
                reduce_op = None
                at = spec.reduce_op
                if at is not None:
                    op = args[at[0]] if at[0] < len(args) else kwargs.get(at[1])
                    reduce_op = "SUM" if op is None else getattr(op, "name", None) or reduce_op_name(op)
                root = root_of(spec, args, kwargs, info) if spec.roots else spec.default_root
                if root is NOT_A_RANK:
                    return None  # torch refuses the call with its own error
                raw = info.sequence() if info.sequence is not None else -1
                # A line with a plan that its identity test did not take (several tensors, a list, another
                # argument object): the same call still, if what it parses to is the same.
                if (
                    plan is not None and plan.spec is spec and plan.info is info
                    and plan.reduce_op == reduce_op and plan.root == root and plan.metas == metas
                ):
                    # The devices are those this line passed last time on this group, which has a backend
                    # for them (a line is kept only then): F1's check is not repeated.
                    signature = plan.signature
                    library = bad = None
                else:
                    bad = bad_device(spec, args, kwargs, info)  # F1
                    signature, library = self._describe(spec, info, reduce_op, root, metas, caller, args,
                                                        kwargs, keep=bad is None)
                if bad is None and spec.name == "barrier" and info.device_types:
                    bad = barrier_mismatch(group, args, kwargs, info.device_types)
            seq = raw - info.offset if raw >= 0 else -1
            renumber = spec.renumbers and raw >= 0
            if renumber and spec.p2p:
                seq = -1  # point-to-point: recorded, never matched with the group's collectives
            now = time.monotonic()
            # CollectiveFingerprint(0, seq, time, signature), inlined: no Python frame for its __init__
            fp = _new(CollectiveFingerprint)
            fp.index = 0  # numbered once recorded
            fp.seq = seq
            fp.time = now + self.wall_offset
            fp.signature = signature
            fp.state = "in"
            fp.metric = None
            if library is not None and library.library in _LIGHTNING:
                # Lightning-issued only (a few per step; DDP's buckets never come through here): name the
                # metric now, since a verdict may be decided before any rank publishes its stack.
                fp.metric = metric_in_stack(sys._getframe(2))
        except Exception as exc:  # noqa: BLE001 - a guard bug must never break training
            self.fail_open(exc)
            return None
        if bad is not None:
            return respond(spec, group, info, bad, fp, rank=self.rank, remedy=self.config.remedy,
                           record=self.record_finding, args=args, kwargs=kwargs)
        if renumber:
            info.renumber_from = raw
            self.renumbering = (info, spec.name)
        main = _thread_id() == self.main_thread_id
        # From here to `ring.count = index`: no call, so no other thread runs in between (the GIL changes
        # hands only at an eval-breaker check): the index is claimed, the call made current and written, in
        # that order. The monitor reads the ring's count before `current`, and folds up to the current call.
        ring = self.ring
        index = fp.index = ring.count + 1
        if main:
            self.entered = now  # before `current`: the monitor reads the two as a pair
            self.current = fp
        else:
            # Another thread's call (an async checkpoint's collectives on a group of its own) is tracked
            # apart: in `current` it would hide, once it returns, the call the main thread waits in.
            self.side[fp] = now
        ring.slots[index & MASK] = fp
        ring.count = index
        flight = self.flight
        if flight is not None:
            try:
                slot = index % flight.slots
                if flight.held[slot] is signature:  # flight.enter's common case, inlined
                    _pack_header(flight.map, FIRST_HEADER + slot * HEADER_STRIDE, b"E", index, seq, fp.time)
                else:
                    flight.enter(fp)
            except (OSError, ValueError) as exc:  # ValueError: the map was closed at exit by another thread
                self.flight = None
                self.fail_open(exc, partial=True)
        return fp

    def _describe(self, spec: intercept.OpSpec, info: GroupInfo, reduce_op: str | None, root: Any,
                  metas: tuple, caller: Any, args: tuple, kwargs: dict, keep: bool) -> tuple[Any, Any]:
        """`before`'s uncommon case: a line not seen before, or passing something else than last time, or a
        library's frame calling: the user's frame and the issuing library's found by walking the stack, and
        the signature interned under them. Kept by line (`keep`: F1 found the devices fine) where the caller
        is the user's own line (a library's frame serves many user lines: the walk decides each time)."""
        code = caller.f_code
        kind = known_kind(code.co_filename)
        user = kind is not None and kind[0] == USER_KIND
        site = known_frame((id(code), caller.f_lasti)) if user else None
        if site is not None:
            library = None
        else:
            site, library = call_sites(4)
        key = (spec.name, info.name, reduce_op, root, site, library, metas)
        signature = self.signatures.get(key) or self.signatures.intern(key, spec, args, kwargs)
        if keep and user and site is not None:
            if len(self.by_line) >= MAX_LINES:
                self.by_line.clear()
                self.hold_fast_path()
            line = (id(code), caller.f_lasti)
            plan = self.by_line[line] = LinePlan(
                spec, info, self.default_group, reduce_op, root, metas, signature, code, args, kwargs)
            if plan.fast and self.main_thread_id == _MAIN_THREAD == _thread_id():
                self.fast[line] = plan
            else:
                self.fast.pop(line, None)
        return signature, library

    def after(self, fp: CollectiveFingerprint, result: Any = None) -> None:
        if self.current is fp:
            self.current = None
        elif self.side:
            self.side.pop(fp, None)
        if self.renumbering is not None:
            self._renumbered()
        if self.pending:
            self.async_work.drain()
        # async_op=True (a Work returned) or CUDA tensors: the collective runs on after the call returns
        if (result is not None or fp.signature.on_gpu) and self.async_work.track(fp, result, time.monotonic):
            return
        fp.state = "done"  # self._done(fp), inlined
        flight = self.flight
        if flight is not None:
            try:
                flight.map[FIRST_HEADER + (fp.index % flight.slots) * HEADER_STRIDE] = 68
            except (OSError, ValueError):  # ValueError: the map was closed at exit by another thread
                self.flight = None

    def failed(self, fp: CollectiveFingerprint, exc: BaseException) -> None:
        fp.state = "failed"
        if self.renumbering is not None:
            self._renumbered()
        if self.flight is not None:
            try:
                self.flight.finish(fp, False)
            except (OSError, ValueError):  # ValueError: the map was closed at exit by another thread
                self.flight = None
        if self.current is fp:
            self.current = None
        elif self.side:
            self.side.pop(fp, None)
        monitor = self.monitor
        # Only backend failures (peer gone, size mismatch, timeout) say something about the other ranks;
        # a bad argument (ValueError, TypeError), torch's own device error, or a RuntimeError the backend
        # raised before the call took a sequence number (gloo's "invalid root rank") is re-raised at once.
        if (
            monitor is not None
            and isinstance(exc, RuntimeError)
            and "No backend type associated" not in str(exc)
            and not never_issued(self.groups.values(), fp)
        ):
            # Judge now, from what every rank recorded, before the exception unwinds and the process dies.
            # Returns only if nothing could be decided, or if the program catches the error (it is reported).
            with self.failing_open():
                self.caught = caught_by_program(sys._getframe(2))
                try:
                    monitor.post_mortem(fp, exc)
                finally:
                    self.caught = False

    def _renumbered(self) -> None:
        assert self.renumbering is not None
        info, op = self.renumbering
        self.renumbering = None
        info.renumbered(op)

    def _done(self, fp: CollectiveFingerprint) -> None:
        fp.state = "done"
        flight = self.flight
        if flight is not None:
            try:
                # flight.finish(fp, True), inlined
                flight.map[FIRST_HEADER + (fp.index % flight.slots) * HEADER_STRIDE] = 68
            except (OSError, ValueError):  # ValueError: the map was closed at exit by another thread
                self.flight = None
