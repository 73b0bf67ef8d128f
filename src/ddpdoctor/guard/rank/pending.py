"""Collectives that returned before they completed: an async call's Work, or (NCCL) a "synchronous" call
that is only queued on the GPU. They stay "in" until seen completed, so that a rank blocked later (in
`work.wait()`, in `.item()`) is seen waiting in the collective that holds it up.

Completion is asked in batches, never once per collective: a CUDA event query takes the CUDA context's
lock, which the training thread needs for every kernel it launches. The training thread only drops, at
each call, the entries at the head already marked done (attribute reads), and queries once per
`QUERY_EVERY` entries queued; the monitor queries at its heartbeat: the newest GPU marker first (one query
retires every marker before it on the same stream, since a stream runs in order), then the oldest ones
until one has not completed."""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

from ...failsafe import swallowed
from ..fingerprint import P2P_OPS, CollectiveFingerprint

PENDING_MAX = 1024  # async collectives tracked until their Work completes; older ones are forgotten
QUERY_EVERY = 32  # the training thread asks about completion once per this many queued entries


class GpuMarker:
    """A CUDA event queued on the caller's stream right after a collective: completed once the GPU has
    run everything queued before it, the collective included."""

    __slots__ = ("event", "device", "done", "stream")

    def __init__(self, event: Any, device: int, query: Any) -> None:
        self.event = event
        self.device = device
        self.done = functools.partial(query, event)  # the C binding itself
        self.stream: Any = None  # the stream it was last recorded on (torch's (id, device, type) tuple)


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
            stream = self.streams[data] = self.new_stream(
                stream_id=data[0], device_index=data[1], device_type=data[2]
            )
        free = self.free.get(device)
        marker = free.pop() if free else GpuMarker(self.new_event(), device, self.query)
        self.record(marker.event, stream)
        marker.stream = data
        return marker

    def recycle(self, marker: GpuMarker) -> None:
        free = self.free.setdefault(marker.device, [])
        if len(free) < 64:
            free.append(marker)


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


# (fingerprint, completion check, monotonic time issued, GPU marker or None)
Pending = tuple[CollectiveFingerprint, Any, float, Any]


class PendingWork:
    """The collectives issued and returned but not seen completed, oldest first. `queue` is shared with
    the hot path, which tests it for emptiness on every call."""

    def __init__(self, done: Callable[[CollectiveFingerprint], None],
                 fail_open: Callable[[BaseException, bool], None]) -> None:
        self.queue: collections.deque[Pending] = collections.deque(maxlen=PENDING_MAX)
        self.done = done  # marks a collective completed (its flight slot)
        self.fail_open = fail_open
        self.gpu: GpuMarkers | None = None  # made at the first collective on CUDA tensors
        self.track_gpu = True
        # GPU markers queued since the training thread last asked: it asks once per QUERY_EVERY. (Counted,
        # not read off the queue's length: a queue full of a lagging GPU's markers stays at its maximum
        # length, a multiple of QUERY_EVERY, and would be asked about at every call.)
        self.unasked = 0

    def track(self, fp: CollectiveFingerprint, result: Any, now: Callable[[], float]) -> bool:
        """Queue a collective that has returned but runs on, if it does: the Work(s) of an async call,
        else (CUDA tensors) a marker behind it on the stream."""
        if result is not None:
            if isinstance(result, list):
                if result and hasattr(result[0], "is_completed"):
                    self.queue.append((fp, functools.partial(completed, result), now(), None))
                    return True
            elif hasattr(result, "is_completed") and result.__class__.__name__ != "_IllegalWork":
                self.queue.append((fp, result.is_completed, now(), None))
                return True
            return False
        if not (fp.signature.on_gpu and self.track_gpu):
            return False
        # NCCL returns from a "synchronous" call once the collective is queued; the host blocks later
        # (`.item()`, the next step). An event queued behind it says when the GPU got past it.
        try:
            if self.gpu is None:
                self.gpu = GpuMarkers()  # a CUDA tensor: CUDA is initialised already
            marker = self.gpu.after_current_stream()
        except Exception as exc:  # noqa: BLE001 - never break training for this
            self.track_gpu = False
            self.fail_open(exc, True)
            return False
        if marker is None:
            return False
        self.queue.append((fp, marker.done, now(), marker))
        self.unasked += 1
        return True

    def drain(self) -> None:
        """On the training thread, at each call while anything is pending: drop the head entries seen
        completed. A CPU Work (gloo's async_op) is asked right here, as cheap as an attribute; a collective on
        the GPU only once per QUERY_EVERY entries queued, else when the monitor has marked it done."""
        queue = self.queue
        while queue:
            fp, check, _, marker = queue[0]
            if fp.state != "done":
                if fp.signature.on_gpu or not safely(check):
                    break
                self.done(fp)
            queue.popleft()
            if marker is not None and self.gpu is not None:
                self.gpu.recycle(marker)
        if queue and self.unasked >= QUERY_EVERY:
            self.unasked = 0
            self.settle()

    def settle(self) -> None:
        """Mark done every pending collective that has completed, in a few queries (see the module's
        docstring); from whichever thread asks. Entries are only marked here, never removed: the training
        thread alone takes them off the queue."""
        try:
            snapshot = list(self.queue)
        except RuntimeError:  # appended to while copied
            return
        newest = snapshot[-1] if snapshot else None
        if newest is not None and newest[3] is not None and newest[0].state != "done" and safely(newest[1]):
            stream = newest[3].stream
            for fp, _, _, marker in snapshot:
                if marker is not None and marker.stream == stream and fp.state != "done":
                    self.done(fp)
        for fp, check, _, _ in snapshot:
            if fp.state == "done":
                continue
            if not safely(check):
                break
            self.done(fp)

    def oldest_open(self) -> tuple[CollectiveFingerprint, float] | None:
        """The oldest collective not completed yet, and since when. Called by the monitor thread, at its
        heartbeat."""
        self.settle()
        try:
            snapshot = list(self.queue)
        except RuntimeError:  # appended to while copied
            return None
        for fp, check, since, _ in snapshot:
            if fp.state == "done":
                continue
            if not safely(check):
                if fp.signature.op in P2P_OPS:
                    continue  # not judged (it pairs with one peer): it must not hide a collective behind it
                return fp, since
            self.done(fp)
        return None
