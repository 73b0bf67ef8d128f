"""What Python's `faulthandler` writes when a process crashes, parsed: the signal, and the stack of each
thread the dump shows. The guard reads it from a rank's fault log; `explain` finds it in a job's log
(`PYTHONFAULTHANDLER=1`, torchrun's `@record`). Standard library only: `explain` runs without torch.

A dump looks like this (Python 3.10 to 3.13; `Stack` when only the crashing thread is dumped, `Current
thread` / `Thread` blocks when every thread is, newest thread first, so the main thread comes last):

    Fatal Python error: Segmentation fault

    Current thread 0x00007f3b2c1d8740 (most recent call first):
      File "/path/train.py", line 18 in load_batch
      File "/path/train.py", line 26 in <module>

    Extension modules: torch._C, ... (total: 20)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

# The first line, per signal (CPython's Modules/faulthandler.c handler table)
SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
_FATAL = re.compile(r"Fatal Python error: (?P<what>" + "|".join(map(re.escape, SIGNALS)) + r")\s*$")
_THREAD = re.compile(r"(?:(?P<current>Current thread)|Thread) 0x[0-9a-f]+ \(most recent call first\):|"
                     r"(?P<only>Stack) \(most recent call first\):")
# `line N in f`, without the comma of a traceback's `line N, in f`: a traceback's frames never match
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+|\?\?\?) in (?P<function>\S+)\s*$')

Frame = tuple[str, int, str]  # file, line (0 when faulthandler could not tell), function; innermost first


class ThreadStack(NamedTuple):
    crashing: bool  # the thread that got the signal (`Current thread`, or the only one dumped)
    frames: list[Frame]


class CrashDump(NamedTuple):
    signal: str  # "SIGSEGV"
    threads: list[ThreadStack]

    def stack(self) -> list[Frame]:
        """The crashing thread's frames; where the signal came from a thread that runs no Python (gloo's
        abort, raised in its I/O thread), the main thread's, which a full dump lists last."""
        for thread in self.threads:
            if thread.crashing:
                return thread.frames
        return self.threads[-1].frames if self.threads else []


def parse_dumps(lines: Iterable[str]) -> list[CrashDump]:
    """Every dump in `lines`, in order. Text before a match on a line (a rank prefix) is ignored, and so are
    the lines between a dump's frames (other ranks' output, interleaved in a combined log): a frame line is
    faulthandler's own form, which tracebacks and logs do not use."""
    dumps: list[CrashDump] = []
    for line in lines:
        fatal = _FATAL.search(line)
        if fatal:
            dumps.append(CrashDump(SIGNALS[fatal.group("what")], []))
            continue
        if not dumps:
            continue
        thread = _THREAD.search(line)
        if thread:
            dumps[-1].threads.append(ThreadStack(bool(thread.group("current") or thread.group("only")), []))
            continue
        frame = _FRAME.search(line) if dumps[-1].threads else None
        if frame:
            number = frame.group("line")
            dumps[-1].threads[-1].frames.append(
                (frame.group("file"), int(number) if number.isdigit() else 0, frame.group("function"))
            )
    return dumps
