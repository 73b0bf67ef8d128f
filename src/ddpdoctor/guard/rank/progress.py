"""Whether this rank's main thread is making progress: what tells a slow rank from a stuck one.

The monitor samples the main thread once per heartbeat (off the training thread; about 15 µs). The thread
*moved* between two samples when its Python stack is somewhere else (another frame, another bytecode offset
in any frame of it), when it spent a share of the time on a CPU (a long matmul or a C extension's loop: the
stack stands still, the thread's CPU clock runs), or when it read or wrote bytes (Linux's per-thread I/O
counters: a checkpoint written, a file downloaded in one C call). A thread blocked in a C call with nothing
coming (a `read` on a silent socket or pipe, a lock, `time.sleep`, a poll with sleeps between) does none of
these: it counts as still, so a rank stuck in its own code is still a hang.

Known limit: a Python loop that spins without sleeping (`while not os.path.exists(flag): pass`) moves,
and counts as working.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

# The share of wall time a thread must have run on a CPU between two samples to count as working: a
# blocked thread runs for microseconds; a computing one for most of the interval, or, on a machine with
# more runnable threads than cores, for its share of one (seen: 14% at a load of 14 on 2 cores).
CPU_SHARE = 0.02
_DEPTH = 64  # frames compared, innermost first: enough to see a loop move, cheap to walk


class MainThreadProgress:
    """Samples one thread; `still_for()` is how long it has not moved."""

    def __init__(self, thread_id: int | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.thread_id = thread_id
        self._clock = clock
        self._cpu_clock = _cpu_clock_of(thread_id)
        self._io_file = _io_file_of(thread_id)
        self._last: tuple[tuple[tuple[int, int], ...], float | None, float, int | None] | None = None
        self._moved_at: float | None = None
        self._samples = 0

    def sample(self) -> None:
        """Look at the thread once; call this every heartbeat."""
        if self.thread_id is None:
            return
        now = self._clock()
        self._samples += 1
        frame = sys._current_frames().get(self.thread_id)
        position = _position(frame)
        cpu = self._cpu_seconds()
        io = self._io_bytes()
        if self._last is not None:
            last_position, last_cpu, last_at, last_io = self._last
            spent = (cpu - last_cpu) if cpu is not None and last_cpu is not None else 0.0
            transferred = io is not None and last_io is not None and io > last_io
            if position != last_position or spent >= CPU_SHARE * max(now - last_at, 1e-3) or transferred:
                self._moved_at = now
        self._last = (position, cpu, now, io)

    def unknown(self) -> bool:
        """Whether it is too early to say: fewer than two samples of a thread that can be sampled."""
        return self.thread_id is not None and self._samples < 2

    def still_for(self) -> float | None:
        """Seconds since the thread last moved; None while it has never been seen moving (a rank that was
        still from its first sample on is judged as it always was)."""
        if self._moved_at is None or self._last is None:
            return None
        return round(self._last[2] - self._moved_at, 3)

    def _cpu_seconds(self) -> float | None:
        if self._cpu_clock is None:
            return None
        try:
            return time.clock_gettime(self._cpu_clock)
        except OSError:  # the thread is gone
            self._cpu_clock = None
            return None


    def _io_bytes(self) -> int | None:
        """Bytes the thread has read and written so far (Linux): a download or a save in one long C call
        moves them, a read blocked on a socket or a pipe does not."""
        if self._io_file is None:
            return None
        try:
            with open(self._io_file, "rb") as handle:
                text = handle.read(256)
        except OSError:
            self._io_file = None
            return None
        total = 0
        for line in text.splitlines()[:2]:  # rchar, wchar
            total += int(line.split(b":", 1)[1])
        return total


def _io_file_of(thread_id: int | None) -> str | None:
    import os
    import threading

    native = next((t.native_id for t in threading.enumerate() if t.ident == thread_id), None)
    path = f"/proc/self/task/{native}/io"
    return path if native is not None and os.path.exists(path) else None


def _position(frame: object) -> tuple[tuple[int, int], ...]:
    """Where a thread's Python stack is: each frame's code and bytecode offset, innermost first."""
    out: list[tuple[int, int]] = []
    while frame is not None and len(out) < _DEPTH:
        out.append((id(frame.f_code), frame.f_lasti))  # type: ignore[attr-defined]
        frame = frame.f_back  # type: ignore[attr-defined]
    return tuple(out)


def _cpu_clock_of(thread_id: int | None) -> int | None:
    """The CPU-time clock of a thread (POSIX), or None where there is none."""
    getter = getattr(time, "pthread_getcpuclockid", None)
    if thread_id is None or getter is None:
        return None
    try:
        return int(getter(thread_id))
    except (OSError, OverflowError, ValueError):
        return None
