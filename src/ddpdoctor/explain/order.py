"""Which failure of a log came first: the root-cause candidate, and the timeouts after it its consequences.

A failure is placed by a `Moment`: its log, its line and, where the line carries one, its time (glog's
`E1122 10:24:44.903`, which c10d, NCCL and torchrun's agent print; an ISO `2024-11-22 10:24:44` of the logging
module and most trainers). Times decide between lines that both carry one (ranks write to separate files,
or one file out of order); otherwise lines of one log are in the order they were written; two lines of
different logs without times are not ordered.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

# (month, day, hour, minute, second, microsecond); glog carries no year, and a job is shorter than one
_GLOG = re.compile(
    r"(?:^|[\[\s])[EWIFD](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d+))?"
)
_ISO = re.compile(
    r"\d{4}-(?P<mo>\d\d)-(?P<d>\d\d)[ T](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d+))?"
)
Time = tuple[int, int, int, int, int, int]


def timestamp(text: str) -> Time | None:
    """The time a log line says it was written, or None."""
    found = _GLOG.search(text[:200]) or _ISO.search(text[:200])
    if not found:
        return None
    fraction = (found.group("f") or "0")[:6].ljust(6, "0")
    return (int(found["mo"]), int(found["d"]), int(found["h"]), int(found["mi"]), int(found["s"]),
            int(fraction))


@dataclass(frozen=True)
class Moment:
    source: str
    line: int
    time: Time | None = None

    def before(self, other: Moment) -> bool:
        """Whether this one is known to come first (see the module's docstring)."""
        if self.time is not None and other.time is not None and self.time != other.time:
            return self.time < other.time
        return self.source == other.source and self.line < other.line


class Role(enum.Enum):
    """What a failure is to the first failure of its log."""

    ROOT = "root"  # the first failure: the root-cause candidate
    CONSEQUENCE = "consequence"  # after the root: a timeout or a lost peer that follows from it
    UNORDERED = "unordered"  # not known to be before or after it


def role(moment: Moment, root: Moment) -> Role:
    if moment == root:
        return Role.ROOT
    return Role.CONSEQUENCE if root.before(moment) else Role.UNORDERED
