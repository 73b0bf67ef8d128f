"""A rank's native crash, told by the rank itself: `faulthandler` writes the signal and the Python stack of
the thread that got it into `rank-<r>.fault` when the process gets SIGSEGV, SIGABRT, SIGBUS, SIGFPE or
SIGILL.

Why: a rank killed by a signal leaves no exit record, and its wait status is read only if `ddpdoctor run`
or a peer sees the process as a zombie before torchrun reaps it (gloo's SIGABRT on a size mismatch was
named in 2 of 4 runs), and nobody knew the line it died on. faulthandler's handler writes from inside the
dying process, then raises the signal again, so the process still dies of it (same exit status), and the
signal and the line are on disk every time. SIGKILL (the OOM killer) cannot be caught: for it the wait
status stays the only witness.

Only the thread that got the signal is dumped. With every thread, the dump walks the frames of threads
that are running meanwhile (the guard's own monitor, in a heartbeat): it printed garbage frames in 1 of 4
runs here and crashed the dying process with SIGSEGV in another, which then died of the wrong signal.
The crashing thread's own stack is the one that holds still, and it is where the crash is: the main
thread's for an extension's segfault or `os.abort()`; none for gloo's abort on a size mismatch, raised
in gloo's I/O thread, which runs no Python (the signal is still named, and the flight file says which
collective the rank was in).

A process whose faulthandler is already on (`python -X faulthandler`, `PYTHONFAULTHANDLER`, torchrun's
`@record`) keeps it: its dump goes where its owner asked, and this log stays empty. A forked child (a
DataLoader worker) gets faulthandler off again, as it was before the guard: its crash is not the rank's.
"""

from __future__ import annotations

import faulthandler
import os
from typing import IO

_log: IO[str] | None = None  # the file faulthandler writes to, where the guard turned it on


def enable(path: str) -> bool:
    """Point faulthandler at `path` (again, for a later process group), unless someone else turned it on."""
    global _log
    if faulthandler.is_enabled() and _log is None:
        return False
    handle = open(path, "w", encoding="utf-8")  # stays open: faulthandler writes to it on a crash
    faulthandler.enable(handle, all_threads=False)
    if _log is None:
        os.register_at_fork(after_in_child=_off_in_child)
    else:
        _log.close()
    _log = handle
    return True


def _off_in_child() -> None:
    global _log
    faulthandler.disable()
    _log = None
