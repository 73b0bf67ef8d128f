"""How a runtime audit's finding leaves the rank: kept with the rank's findings (for report.json) and one
`[ddpdoctor] warning:` line on stderr, once per finding in the rank that made it."""

from __future__ import annotations

import sys
from collections.abc import Callable

from ..findings import Finding


class Announcer:
    """Calls `report` and prints one line, once per distinct message."""

    def __init__(self, report: Callable[[Finding], None]) -> None:
        self._report = report
        self.said: set[str] = set()

    def __call__(self, finding: Finding, rank: int | None = None) -> None:
        if finding.message in self.said:
            return
        self.said.add(finding.message)
        self._report(finding)
        where = f" (rank {rank})" if rank is not None else ""
        try:
            print(f"[ddpdoctor] warning{where}: {finding.message}", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # stderr closed
            pass
