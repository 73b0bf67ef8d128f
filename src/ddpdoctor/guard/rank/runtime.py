"""The guard inside one process: per-call bookkeeping (hot path), group discovery, and fail-open.

`before`/`after`/`failed` run in the caller's thread for every guarded collective and must stay cheap
(target: <= 20 µs added): they build the fingerprint, check F1, append to the in-memory ring and write
the flight-file slot. Nothing here talks to the store; the monitor thread does that.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import sys
import time
from collections.abc import Iterator
from threading import get_ident as _thread_id
from typing import Any

from ...audits.backend_device import (
    BackendDeviceMismatchError,
    BarrierDevice,
    Remedy,
    barrier_device_type,
    error_text,
    mismatch_finding,
)
from ...findings import Finding
from ..callsite import call_sites
from ..config import GuardConfig
from ..failsafe import attempt, swallowed
from ..fingerprint import P2P_OPS, CollectiveFingerprint, CollectiveSignature, seqs_by_group
from ..protocol import RunDir, atomic_write_json
from . import intercept, lifecycle
from .consensus import ChainCheck
from .flight import FlightFile
from .lightning_metrics import metric_in_stack

_LIGHTNING = ("lightning", "pytorch_lightning")

MAX_SIGNATURES = 4096  # distinct (call site, arguments, tensor metadata) kept encoded
PENDING_MAX = 1024  # async collectives tracked until their Work completes; older ones are forgotten


class GpuMarker:
    """A CUDA event queued on the caller's stream right after a collective: completed once the GPU has
    run everything queued before it, the collective included."""

    __slots__ = ("event", "device", "done")

    def __init__(self, event: Any, device: int, query: Any) -> None:
        self.event = event
        self.device = device
        self.done = functools.partial(query, event)  # the C binding itself: polled on every collective


class GpuMarkers:
    """Pooled GpuMarkers, recorded through torch's C bindings: `torch.cuda.Event().record()` goes through
    `current_stream()`, which builds a Stream object per call and costs several times the rest of the
    hot path. Events are pooled per device (an event belongs to the device it was first recorded on)."""

    def __init__(self) -> None:
        import torch

        bindings = torch._C
        self.capturing = bindings._cuda_isCurrentStreamCapturing
        self.device = bindings._cuda_getDevice
        self.stream_of = bindings._cuda_getCurrentStream
        self.record = bindings._CudaEventBase.record
        self.query = bindings._CudaEventBase.query
        self.new_stream = torch.cuda.Stream
        self.new_event = torch.cuda.Event
        self.streams: dict[tuple, Any] = {}
        self.free: dict[int, list[GpuMarker]] = {}

    def after_current_stream(self) -> GpuMarker | None:
        if self.capturing():  # inside a CUDA graph capture an event would become a graph node
            return None
        device = self.device()
        data = self.stream_of(device)
        stream = self.streams.get(data)
        if stream is None:
            stream = self.streams[data] = self.new_stream(stream_id=data[0], device_index=data[1], device_type=data[2])
        free = self.free.get(device)
        marker = free.pop() if free else GpuMarker(self.new_event(), device, self.query)
        self.record(marker.event, stream)
        return marker

    def recycle(self, marker: GpuMarker) -> None:
        free = self.free.setdefault(marker.device, [])
        if len(free) < 64:
            free.append(marker)


def reduce_op_name(op: Any) -> str:
    """The name of a ReduceOp *object*: `dist.ReduceOp(dist.ReduceOp.AVG)`, or the PREMUL_SUM that FSDP
    builds with a divide factor. Its str() carries its address, which differs on every rank. (The enum
    members, `dist.ReduceOp.SUM`, have a `.name` and never get here.)"""
    name = getattr(getattr(op, "op", None), "name", None)
    if name:
        return str(name)
    text = str(op)
    if " object at 0x" in text:
        return type(op).__name__
    return text.rsplit(".", 1)[-1]


def _roles(spec: intercept.OpSpec, args: tuple, kwargs: dict) -> tuple[str, ...]:
    """Per compared tensor of a call, in the order `GuardRuntime.before` records their shapes, whether the
    call reads it ("in"), fills it ("out") or both (""). Only for a signature not seen before."""
    roles: list[str] = []
    for index, name, compared in spec.tensors:
        value = args[index] if index < len(args) else kwargs.get(name)
        if value is None or not compared:
            continue
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            for tensor in item if isinstance(item, (list, tuple)) else (item,):
                if getattr(tensor, "device", None) is not None:
                    roles.append(intercept.role_of(spec.name, name))
    return tuple(roles)


def completed(works: Any) -> bool:
    """Whether every Work of one async call (batch_isend_irecv returns several) has completed."""
    return all(work.is_completed() for work in works)


def safely(check: Any) -> bool:
    """Whether an async call completed; one whose Work cannot tell holds nothing up. On the hot path:
    no context manager."""
    try:
        return bool(check())
    except Exception as exc:  # noqa: BLE001 - a Work that cannot tell: hold nothing up on it
        swallowed("runtime: an async Work's completion", exc)
        return True


def _backend_name(group: Any) -> str:
    import torch.distributed as dist

    return str(dist.get_backend(group))


class GroupInfo:
    __slots__ = (
        "group", "name", "device_types", "devices_ok", "backend", "sequence", "member", "offset", "renumber_from",
        "global_ranks",
    )

    def __init__(self, group: Any) -> None:
        self.group = group
        # This rank's share of the sequence number that came from fingerprint.RENUMBERED_OPS ops, and the raw number
        # when one of them is in progress (the monitor publishes that while it runs).
        self.offset = 0
        self.renumber_from: int | None = None
        # torch passes a placeholder object for groups this rank is not in; the call is then a no-op
        self.member = hasattr(group, "_get_sequence_number_for_group")
        self.name = attempt("GroupInfo: the group's name", lambda: str(group.group_name), str(id(group)))
        # unknown backend: do not judge devices
        self.device_types: frozenset[str] = attempt(
            "GroupInfo: the group's device types", lambda: frozenset(d.type for d in group._device_types), frozenset()
        )
        # Devices already found to have a backend here: `device in set` costs a tenth of `device.type`,
        # which builds a new string on every call.
        self.devices_ok: set = set()
        self.backend = attempt("GroupInfo: the group's backend", lambda: _backend_name(group), "?")
        self.global_ranks: list[int] | None = None  # read at the first group_src= / group_dst=
        sequence = getattr(group, "_get_sequence_number_for_group", None)
        # backends without sequence numbers
        if sequence is not None and attempt("GroupInfo: the group's sequence number", sequence, None) is None:
            sequence = None
        self.sequence = sequence

    def global_rank(self, group_rank: int) -> int:
        """The global rank of a group rank (fingerprints name every root by its global rank, as `src=` does)."""
        if self.global_ranks is None:
            import torch.distributed as dist

            self.global_ranks = list(dist.get_process_group_ranks(self.group))
        if 0 <= group_rank < len(self.global_ranks):
            return self.global_ranks[group_rank]
        return group_rank  # out of range: torch raises its own error for it


class GuardRuntime:
    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.ring: collections.deque[CollectiveFingerprint] = collections.deque(maxlen=config.ring_size)
        self.current: CollectiveFingerprint | None = None  # the main thread's call in progress
        self.entered = 0.0
        self.side: dict[CollectiveFingerprint, float] = {}  # other threads' calls in progress, and since when
        # One clock read per collective: wall time is the monotonic one plus this (the drift of a wall
        # clock slewed by NTP over a job is milliseconds, below what a report shows).
        self.wall_offset = time.time() - time.monotonic()
        self.started = time.time()
        self.count = 0
        self.rank: int | None = None
        self.world_size: int | None = None
        self.flight: FlightFile | None = None
        self.groups: dict[Any, GroupInfo] = {}
        self.signatures: dict[tuple, CollectiveSignature] = {}
        self.gpu_done: GpuMarkers | None = None  # made at the first collective on CUDA tensors
        self.track_gpu = True
        # (fingerprint, completion check, monotonic time issued, GPU marker or None) of async collectives
        # not seen completed yet
        self.pending: collections.deque[tuple[CollectiveFingerprint, Any, float, Any]] = collections.deque(
            maxlen=PENDING_MAX
        )
        self.default_group: Any = None
        self.monitor: Any = None
        self.disabled = False
        self.run_dir = config.run_dir
        self._own_run_dir = False
        self.findings: list[Finding] = []
        self.main_thread_id: int | None = None
        self.chain = ChainCheck(0)
        self.issue = self.chain.issued.append  # the hot path's share of the cross-rank chain check
        self.renumbering: tuple[GroupInfo, str] | None = None  # a fingerprint.RENUMBERED_OPS op in progress
        self.paused: Any = None  # the monitor, stopped by a post-mortem that decided nothing
        self.exited = False
        self.left_group = False  # destroy_process_group() ran; a new init_process_group starts over
        self.fatal: BaseException | None = None  # the uncaught exception this rank is dying of
        self.generation = 0  # default groups this process has had before the current one (store keys)
        self.pid = os.getpid()  # a forked child (DataLoader worker) inherits this object but is not the rank
        self.resumed = 0.0  # monotonic time at which the monitor last found this process running again after a stop

    # ---- group lifecycle (lifecycle.py) ------------------------------------------------------------
    def group_ready(self) -> None:
        lifecycle.group_ready(self)

    def group_destroyed(self) -> None:
        lifecycle.group_destroyed(self)

    def info(self, group: Any) -> GroupInfo:
        info = self.groups.get(group)
        if info is None:
            info = self.groups[group] = GroupInfo(group)
        return info

    # ---- hot path ---------------------------------------------------------------------------------
    def before(self, spec: intercept.OpSpec, args: tuple, kwargs: dict) -> Any:
        if self.disabled:
            return None
        if self.paused is not None:  # the program caught a collective's error and goes on
            monitor, self.paused = self.paused, None
            monitor.resume()
        try:
            at = spec.group  # (position, name) of the group parameter; inlined intercept.argument
            group = None if at is None else args[at[0]] if at[0] < len(args) else kwargs.get(at[1])
            if group is None:
                group = self.default_group
                if group is None:
                    return None  # no group yet: torch raises its own (F9) error
            info = self.groups.get(group) or self.info(group)
            if not info.member:
                return None
            # The tensors' metadata, as torch hands it out (hashable, nothing converted): the key, with the
            # call site, of this call's interned signature.
            metas: list = []
            bad = None
            types = info.device_types
            ok = info.devices_ok
            for index, name, compared in spec.tensors:
                value = args[index] if index < len(args) else kwargs.get(name)
                if value is None:
                    continue
                if not isinstance(value, (list, tuple)):  # one tensor: the common case, without the loops
                    device = getattr(value, "device", None)
                    if device is not None:
                        if types and device not in ok:
                            if device.type in types:
                                ok.add(device)
                            elif bad is None:
                                bad = value
                        metas.append((value.shape, value.dtype, device) if compared else device)
                    continue
                for item in value:
                    if isinstance(item, (list, tuple)):  # all_gather_coalesced: lists of lists
                        flat = item
                    else:
                        flat = (item,)
                    for tensor in flat:
                        device = getattr(tensor, "device", None)
                        if device is None:
                            continue
                        if types and device not in ok:
                            if device.type in types:
                                ok.add(device)
                            elif bad is None:
                                bad = tensor
                        # rank-local tensors (gather_list, scatter_list) need not agree: device only
                        metas.append((tensor.shape, tensor.dtype, device) if compared else device)
            if bad is None and types and spec.name == "barrier":
                # No tensor, but torch picks a device for it, and fails the same way on a group without a
                # backend for that device (an NCCL-only group used where torch sees no accelerator).
                device_ids = args[2] if len(args) > 2 else kwargs.get("device_ids")
                predicted = barrier_device_type(group, device_ids)
                if predicted is not None and predicted not in types:
                    bad = BarrierDevice(predicted)
            reduce_op = None
            at = spec.reduce_op
            if at is not None:
                op = args[at[0]] if at[0] < len(args) else kwargs.get(at[1])
                reduce_op = "SUM" if op is None else getattr(op, "name", None) or reduce_op_name(op)
            root = spec.default_root
            for index, name, group_rank in spec.roots:
                value = args[index] if index < len(args) else kwargs.get(name)
                if value is not None:
                    if value.__class__ is not int:
                        try:
                            value = int(value)
                        except (TypeError, ValueError):
                            return None  # not a rank: torch refuses the call with its own error
                    root = info.global_rank(value) if group_rank else value
                    break
            raw = info.sequence() if info.sequence is not None else -1
            seq = raw - info.offset if raw >= 0 else -1
            renumber = spec.renumbers and raw >= 0
            if renumber and spec.p2p:
                seq = -1  # point-to-point: recorded, never matched with the group's collectives
            site, library = call_sites(3)
            key = (spec.name, info.name, reduce_op, root, site, library, tuple(metas))
            signature = self.signatures.get(key)
            if signature is None:
                signature = self._signature(key, spec, args, kwargs)
            self.count += 1
            now = time.monotonic()
            fp = CollectiveFingerprint(self.count, seq, now + self.wall_offset, signature)
            if library is not None and library.library in _LIGHTNING:
                # Lightning-issued only (a few per step; DDP's buckets never come through here): name the
                # metric now, since a verdict may be decided before any rank publishes its stack.
                fp.metric = metric_in_stack(sys._getframe(2))
        except Exception as exc:  # noqa: BLE001 - a guard bug must never break training
            self.fail_open(exc)
            return None
        if bad is not None:
            return self._device_mismatch(spec, group, info, bad, fp)
        if renumber:
            info.renumber_from = raw
            self.renumbering = (info, spec.name)
        self.ring.append(fp)
        if _thread_id() == self.main_thread_id:
            self.entered = now  # before `current`: the monitor reads the two as a pair
            self.current = fp  # before it is queued: the monitor folds queued calls up to the current one
        else:
            # Another thread's call (an async checkpoint's collectives on a group of its own) is tracked
            # apart: in `current` it would hide, once it returns, the call the main thread waits in.
            self.side[fp] = now
        self.issue(fp)
        flight = self.flight
        if flight is not None:
            try:
                flight.enter(fp)
            except OSError as exc:
                self.flight = None
                self.fail_open(exc, partial=True)
        return fp

    def _signature(self, key: tuple, spec: intercept.OpSpec, args: tuple, kwargs: dict) -> CollectiveSignature:
        """Build and intern the signature for a key not seen before (a new call site or new shapes)."""
        op, group, reduce_op, root, site, library, metas = key
        compare_shapes = spec.compare_shapes
        shapes: list = []
        dtypes: list = []
        devices: list = []
        for meta in metas:
            device = meta
            if meta.__class__ is tuple:
                shape, dtype, device = meta
                if compare_shapes:
                    shapes.append(list(shape))
                dtypes.append(str(dtype).replace("torch.", ""))
            devices.append(str(device) if device.index is not None else device.type)
        roles = _roles(spec, args, kwargs) if shapes else ()
        signature = CollectiveSignature(group, op, reduce_op, root, shapes, dtypes, devices, site, library,
                                        roles if len(roles) == len(shapes) and any(roles) else ())
        if len(self.signatures) >= MAX_SIGNATURES:
            self.signatures.clear()  # shapes that change every step (variable-length batches)
        self.signatures[key] = signature
        return signature

    def _renumber(self) -> None:
        """Take the increments of the point-to-point op (or monitored_barrier) that just returned out of
        this rank's numbering; a monitored_barrier keeps one number, as the collective it is."""
        assert self.renumbering is not None
        info, op = self.renumbering
        self.renumbering = None
        start = info.renumber_from
        if start is not None and info.sequence is not None:
            info.offset += info.sequence() - start - (1 if op == "monitored_barrier" else 0)
        info.renumber_from = None

    def after(self, fp: CollectiveFingerprint, result: Any = None) -> None:
        if self.current is fp:
            self.current = None
        elif self.side:
            self.side.pop(fp, None)
        if self.renumbering is not None:
            self._renumber()
        pending = self.pending
        if pending:
            self._drain(pending)
        if result is not None:
            # async_op=True: the call returned a Work and the collective runs on; it stays "in" until the
            # Work completes, so that a rank blocked later in `work.wait()` is seen waiting in it.
            if isinstance(result, list):
                if result and hasattr(result[0], "is_completed"):
                    pending.append((fp, functools.partial(completed, result), time.monotonic(), None))
                    return
            elif hasattr(result, "is_completed") and result.__class__.__name__ != "_IllegalWork":
                pending.append((fp, result.is_completed, time.monotonic(), None))
                return
        elif fp.signature.on_gpu and self.track_gpu:
            # NCCL returns from a "synchronous" call once the collective is queued; the host blocks later
            # (`.item()`, the next step). An event queued behind it says when the GPU got past it.
            try:
                if self.gpu_done is None:
                    self.gpu_done = GpuMarkers()  # a CUDA tensor: CUDA is initialised already
                marker = self.gpu_done.after_current_stream()
            except Exception as exc:  # noqa: BLE001 - never break training for this
                self.track_gpu = False
                self.fail_open(exc, partial=True)
                marker = None
            if marker is not None:
                pending.append((fp, marker.done, time.monotonic(), marker))
                return
        self._done(fp)

    def _drain(self, pending: collections.deque) -> None:
        """Retire the async collectives at the head that have completed (oldest first: they complete in
        order on one stream or connection)."""
        while pending and safely(pending[0][1]):
            fp, _, _, marker = pending.popleft()
            self._done(fp)
            if marker is not None and self.gpu_done is not None:
                self.gpu_done.recycle(marker)

    def _done(self, fp: CollectiveFingerprint) -> None:
        fp.state = "done"
        flight = self.flight
        if flight is not None:
            try:
                flight.finish(fp, True)
            except (OSError, ValueError):  # ValueError: the map was closed at exit by another thread
                self.flight = None

    def waiting(self) -> tuple[CollectiveFingerprint, float] | None:
        """The collective this rank is held up by, and since when (monotonic): the call its main thread is
        in, else the oldest async collective whose Work has not completed. Called by the monitor thread.

        A wait that spans a stop of this process (Ctrl-Z, SIGSTOP, a suspended machine) counts from the
        resumption: the monotonic clock runs on while nothing runs, and a peer that is legitimately
        elsewhere would otherwise be judged hung the moment the job is continued."""
        held = self._held()
        if held is None:
            return None
        return held[0], max(held[1], self.resumed)

    def _held(self) -> tuple[CollectiveFingerprint, float] | None:
        current = self.current
        if current is not None:
            return current, self.entered
        try:
            side = list(self.side.items())
            snapshot = list(self.pending)
        except RuntimeError:  # appended to while copied
            return None
        if side:
            return min(side, key=lambda item: item[1])
        for fp, check, since, _ in snapshot:
            if fp.state == "done":
                continue
            if not safely(check):
                if fp.signature.op in P2P_OPS:
                    continue  # not judged (it pairs with one peer): it must not hide a collective behind it
                return fp, since
            self._done(fp)
        return None

    def failed(self, fp: CollectiveFingerprint, exc: BaseException) -> None:
        fp.state = "failed"
        if self.renumbering is not None:
            self._renumber()
        if self.flight is not None:
            try:
                self.flight.finish(fp, False)
            except OSError:
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
            and not self._never_issued(fp)
        ):
            # A backend error (peer gone, size mismatch): judge now, from what every rank recorded, before
            # the exception unwinds and the process dies. Returns only if nothing could be decided.
            with self.failing_open():
                monitor.post_mortem(fp, exc)

    def _never_issued(self, fp: CollectiveFingerprint) -> bool:
        """Whether a call that raised left its group's sequence number where it found it: the backend
        refused it locally, and no peer waits for it."""
        if fp.seq < 0:
            return False
        for info in list(self.groups.values()):
            if info.name == fp.signature.group and info.sequence is not None:
                number = attempt("runtime: the sequence number of an aborted group", info.sequence, None)
                return number is not None and number - info.offset == fp.seq
        return False

    # ---- F1 --------------------------------------------------------------------------------------
    def _device_mismatch(self, spec: intercept.OpSpec, group: Any, info: GroupInfo, tensor: Any, fp: Any) -> Any:
        from ...findings import Severity


        backends = sorted(info.device_types)
        finding = mismatch_finding(
            op=spec.name,
            tensor=tensor,
            group_name=info.name,
            backends=backends,
            backend_name=info.backend,
            site=fp.site,
            library=fp.library,
            metric=fp.metric,
            rank=self.rank,
            severity=Severity.WARNING if self.config.remedy else Severity.ERROR,
        )
        self.record_finding(finding)
        if self.config.remedy:
            return Remedy(spec, group, backends, finding, fp.site)
        return BackendDeviceMismatchError(error_text(finding, finding.fix.message if finding.fix else ""), finding)

    def record_finding(self, finding: Finding) -> None:
        """Keep a finding of this rank and leave it where the launcher collects findings."""
        if any(f.message == finding.message for f in self.findings):
            return
        self.findings.append(finding)
        if self.run_dir is None:
            return
        try:
            from ...findings import dumps

            path = RunDir(self.run_dir).findings(self.rank if self.rank is not None else os.getpid())
            atomic_write_json(path, None, text=dumps(self.findings))
        except OSError:
            pass

    # ---- fail-open -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def failing_open(self) -> Iterator[None]:
        """Run a block of the guard's own work (not the hot path's: a `with` costs there) whose failure
        disables the guard, with one warning, instead of reaching the program."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - a guard bug must never break training
            self.fail_open(exc)

    def fail_open(self, exc: BaseException, partial: bool = False) -> None:
        """One warning, then training goes on unguarded."""
        swallowed("runtime.fail_open", exc)
        if self.disabled:
            return
        if not partial:
            self.disabled = True
        print(
            f"[ddpdoctor] warning: the guard {'lost a part' if partial else 'disabled itself'} "
            f"({type(exc).__name__}: {exc}); training continues {'with less' if partial else 'unguarded'}",
            file=sys.stderr,
            flush=True,
        )
        if not partial and self.monitor is not None:
            self.monitor.stop(exited=False, quiet=True)

    def sequence_numbers(self) -> dict[str, int]:
        """Each known group's sequence number now, C++-issued collectives included."""
        out = {}
        for info in list(self.groups.values()):
            if info.sequence:
                start = info.renumber_from  # read first: it is cleared after the offset is updated
                out[info.name] = (start if start is not None else info.sequence()) - info.offset
        return out

    def recent(self) -> list[CollectiveFingerprint]:
        return list(self.ring)

    def python_history(self) -> tuple[dict[str, list[int]], bool]:
        """Per group, the sequence numbers of the collectives this rank issued from Python that the ring
        still holds, and whether the ring holds everything since the group began (nothing dropped). With
        them a peer can tell "I made call #k" from "#k was a C++ collective" beyond its last few records."""
        ring = list(self.ring)
        return seqs_by_group((fp.signature.group, fp.seq) for fp in ring), len(ring) < (self.ring.maxlen or 0)

    def remove_files(self) -> None:
        """Outside `ddpdoctor run` nobody reads the flight and meta files after this process is done."""
        import shutil

        if self.flight is not None:
            self.flight.close()
            if not self.config.launched and self.run_dir is not None and self.rank is not None:
                files = RunDir(self.run_dir)
                for path in files.rank_files(self.rank):
                    files.remove(path)
        if self.run_dir and not self.config.launched:
            if self._own_run_dir:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            else:
                try:
                    os.rmdir(self.run_dir)  # only once the last rank of the job on this host is done
                except OSError:
                    pass
