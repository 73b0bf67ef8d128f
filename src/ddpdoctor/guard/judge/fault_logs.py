"""A rank's fault log read back (by its peers' judge and the launcher): the signal it died of and the
Python stack faulthandler wrote for it (`rank/fault_log.py` points faulthandler at the file)."""

from __future__ import annotations

from typing import NamedTuple

from ...callsite import select_stack
from ...records import Frame

_READ_MAX = 256 * 1024  # a dump is a few KB: 100 frames at most


class FatalSignal(NamedTuple):
    name: str  # "SIGABRT"
    # the crashing thread's, innermost first, as `stack_of` selects frames; [] if no Python
    stack: list[Frame]


def read_fault_log(path: str) -> FatalSignal | None:
    """The signal a rank died of and where, or None when its log holds no dump (it did not crash, or the
    file is not there)."""
    from ...crash_dump import parse_dumps  # its patterns are compiled on import: not in every rank's start

    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            dumps = parse_dumps(handle.read(_READ_MAX).splitlines())
    except OSError:
        return None
    if not dumps:
        return None
    return FatalSignal(dumps[0].signal, select_stack(dumps[0].stack()))
