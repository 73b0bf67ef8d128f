"""The thread a rank's monitor runs on, with the life of the process group it watches: a daemon that ends
when the group is destroyed or the interpreter exits, and that a test harness can stop (`stop()`, as
Lightning's test suite calls on every daemon thread a test leaves behind) within `JOIN_WITHIN` seconds."""

from __future__ import annotations

import threading
from collections.abc import Callable

THREAD_NAME = "ddpdoctor-monitor"
# A heartbeat's store calls take milliseconds; a store that stopped answering is given up on after this long
# (the thread is a daemon: it cannot keep the process alive, only a harness's check waiting).
JOIN_WITHIN = 2.0


class MonitorThread(threading.Thread):
    """Runs `loop` until `halt` makes it return; `stop()` halts it and waits for it to end."""

    def __init__(self, loop: Callable[[], None], halt: Callable[[], None]) -> None:
        super().__init__(target=loop, name=THREAD_NAME, daemon=True)
        self._halt = halt

    def stop(self, timeout: float = JOIN_WITHIN) -> None:
        """End the heartbeat loop and wait (at most `timeout` seconds) for the thread to end. The group's
        last record is not published here: `destroy_process_group` or the interpreter's exit still does
        that; this only takes the thread away, for a harness that stops foreign threads."""
        self._halt()
        self.join_within(timeout)

    def join_within(self, timeout: float = JOIN_WITHIN) -> None:
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout)
