"""Whether this rank's main thread is making progress: what tells a slow rank from a stuck one.

The monitor samples the main thread once per heartbeat (off the training thread; a few microseconds). The
thread *moved* between two samples when its Python stack is somewhere else (another frame, another
bytecode offset in any frame of it), or when it spent a share of the time on a CPU (a long
matmul or a C extension's loop: the stack stands still, the thread's CPU clock runs). A thread blocked in
a C call (a `read` on a socket or a pipe, a lock, `time.sleep`, a poll with sleeps between) does neither:
it counts as still, so a rank stuck in its own code is still a hang.

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
        self._last: tuple[tuple[tuple[int, int], ...], float | None, float] | None = None
        self._moved_at: float | None = None

    def sample(self) -> None:
        """Look at the thread once; call this every heartbeat."""
        if self.thread_id is None:
            return
        now = self._clock()
        frame = sys._current_frames().get(self.thread_id)
        position = _position(frame)
        cpu = self._cpu_seconds()
        if self._last is not None:
            last_position, last_cpu, last_at = self._last
            spent = (cpu - last_cpu) if cpu is not None and last_cpu is not None else 0.0
            if position != last_position or spent >= CPU_SHARE * max(now - last_at, 1e-3):
                self._moved_at = now
        self._last = (position, cpu, now)

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
