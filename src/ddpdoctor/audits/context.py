"""What the runtime audits get from the code that installs them in a rank (the guard, through
`hooks.install_all`): the one way they reach the job's store and the rank's findings.

The audits never ask the guard for its runtime. The guard hands them an `AuditContext` (its implementation
is the guard's `rank/audit_context.py`), so the audits import nothing of the guard's and the guard, which
installs them, is the only one of the two that imports the other. A test hands them its own.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Protocol

from ..findings import Finding


class StoreClient(Protocol):
    """The calls the audits make on the job's store (torch's `Store`, whose stubs lack `append`)."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def append(self, key: str, value: str) -> None: ...

    def check(self, keys: list[str]) -> bool: ...

    def wait(self, keys: list[str]) -> None: ...

    def set_timeout(self, timeout: datetime.timedelta) -> None: ...


@dataclass(frozen=True)
class AuditStore:
    """A client of the job's store of the audit's own (never the training thread's: an audit's wait must
    not stall it) and the prefix under which the audit keeps its keys (its namespace under this run's
    keys, which a later default group of the process changes)."""

    client: StoreClient
    prefix: str


class AuditContext(Protocol):
    """What an installed audit may ask of the rank it runs in."""

    def report(self, finding: Finding) -> None:
        """Keep a finding with the rank's findings (the launcher merges them into report.json)."""

    def store(self, namespace: str, timeout_s: float | None = None) -> AuditStore | None:
        """The job's store for the audit's keys under `namespace`; None outside a multi-rank job."""

    def sequence(self) -> int:
        """The default group's sequence number now: the point of the job between two collectives (with
        the guard's correction for point-to-point ops, which gloo counts on the ranks involved only)."""
