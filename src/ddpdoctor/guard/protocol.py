"""What the guard leaves on disk and in the job's store, named in one place.

The run directory (`ddpdoctor run`'s, or the one `install()` picks per job) holds, per rank, its meta,
flight, exit and fault files and its findings, and for the job the report's files and the marks that
say who reported and printed (`RunDir`). Every JSON file in it is written whole or not at all
(`atomic_write_json`): the launcher may SIGKILL a rank mid-write, and a reader must never see half a file.

The job's store holds the guard's keys under one prefix per restart and default group (`StoreKeys`);
its `control` key is the judge's state machine (`Control`): idle -> suspect (a rank waits longer than
the grace period) -> verdict:<rank> (that rank reports; everyone else stops), or idle -> leaving (the rank
hosting the store finished: the others let go of it).
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

REPORT_FILE = "report.json"
_META = re.compile(r"^rank-(\d+)\.meta\.json$")


def atomic_write_json(path: str, data: Any, *, text: str | None = None) -> None:
    """Write `data` as JSON (or `text` as it is) to `path` through a temporary file of this process, then
    rename it into place: readers see the old file or the new one, never a part."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            if text is not None:
                handle.write(text)
            else:
                json.dump(data, handle, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: str) -> Any:
    """A JSON file's value, or None if it is missing or not JSON."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


class Mark(str, enum.Enum):
    """Empty files in the run directory that say how far the report got."""

    REPORTED = "reported"  # a rank decided and wrote the report's files
    PRINTED = "printed"  # ... and finished printing it
    ADOPTED = "adopted"  # a rank of this launcher took in the report another launcher's rank decided
    JOINING_CLAIM = "joining.claim"  # the rank of this host that reports a stuck init_process_group
    STOPPING = "stopping"  # `ddpdoctor run` passed a stop signal on: what the ranks see next is its doing


@dataclass(frozen=True)
class RunDir:
    """Every path a run directory holds."""

    path: str

    def _rank_file(self, rank: int | str, suffix: str) -> str:
        return os.path.join(self.path, f"rank-{rank}{suffix}")

    def meta(self, rank: int) -> str:
        """Who the rank is (pid, host): the launcher watches it, peers find its files by it."""
        return self._rank_file(rank, ".meta.json")

    def flight(self, rank: int) -> str:
        return self._rank_file(rank, ".flight")

    def exit_record(self, rank: int) -> str:
        return self._rank_file(rank, ".exit.json")

    def fault_log(self, rank: int) -> str:
        return self._rank_file(rank, ".fault")

    def findings(self, rank: int | str, pid: int | None = None) -> str:
        """A process's own findings (F1, the audits'), for the launcher to collect: named by its rank and pid
        (the same rank of a later job in the same run is another process, whose findings are kept too); a
        rank not yet known is its pid alone."""
        name = f"findings-rank-{rank}-{pid}.json" if pid is not None else f"findings-rank-{rank}.json"
        return os.path.join(self.path, name)

    def job_of(self, rank: int) -> str:
        """The name of the report folder of the job this rank is in (`job-<n>`), for the launcher."""
        return self._rank_file(rank, ".job")

    def joining(self, rank: int | str) -> str:
        return os.path.join(self.path, f"joining-{rank}.json")

    @property
    def report(self) -> str:
        return os.path.join(self.path, REPORT_FILE)

    def rank_files(self, rank: int) -> tuple[str, ...]:
        """What one rank leaves behind, for a rank that cleans up after itself."""
        return (
            self.flight(rank),
            self.meta(rank),
            self.exit_record(rank),
            self.fault_log(rank),
            self.findings(rank, os.getpid()),
            self.job_of(rank),
        )

    def metas(self) -> Iterator[tuple[int, str]]:
        """(rank, path) of every meta file there, in directory order."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return
        for name in names:
            found = _META.match(name)
            if found:
                yield int(found.group(1)), os.path.join(self.path, name)

    def finding_files(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.path))
        except OSError:
            return []
        return [
            os.path.join(self.path, n) for n in names if n.startswith("findings-") and n.endswith(".json")
        ]

    def joining_files(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.path))
        except OSError:
            return []
        return [os.path.join(self.path, n) for n in names if n.startswith("joining-") and n.endswith(".json")]

    # ---- marks and claims --------------------------------------------------------------------------
    def mark_path(self, mark: Mark) -> str:
        return os.path.join(self.path, mark.value)

    def has(self, mark: Mark) -> bool:
        return os.path.exists(self.mark_path(mark))

    def set_mark(self, mark: Mark, rank: Any) -> None:
        """Leave a mark, naming the rank that left it; a directory that is gone is no error."""
        try:
            with open(self.mark_path(mark), "w", encoding="utf-8") as handle:
                handle.write(str(rank))
        except OSError:
            pass

    def claim(self, mark: Mark) -> bool:
        """Create the mark if nobody has: True for the one process (of any launcher sharing the directory)
        that did."""
        try:
            os.close(os.open(self.mark_path(mark), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass


class Control(str, enum.Enum):
    """The states of the job's `control` key."""

    IDLE = "idle"
    SUSPECT = "suspect"  # a rank waits past the grace period: every rank publishes its stack
    VERDICT = "verdict"  # stored as `verdict:<rank>`: that rank reports, everyone else stops
    LEAVING = "leaving"  # the rank hosting the store finished: the others let go of it


@dataclass(frozen=True)
class ControlValue:
    """The `control` key's value, read."""

    state: Control
    judge: int | None = None  # for VERDICT: the rank that reports

    @classmethod
    def parse(cls, value: str) -> ControlValue:
        if value.startswith(Control.VERDICT.value):
            _, _, rank = value.partition(":")
            return cls(Control.VERDICT, int(rank) if rank.isdigit() else None)
        try:
            return cls(Control(value))
        except ValueError:  # an empty key (not initialised yet) counts as idle
            return cls(Control.IDLE)

    @staticmethod
    def verdict_of(rank: int) -> str:
        return f"{Control.VERDICT.value}:{rank}"


@dataclass(frozen=True)
class StoreKeys:
    """Every key the guard uses in the job's store. `restart`: torchelastic's restart count; `generation`:
    a process that destroys its default group and makes a new one starts on fresh keys."""

    restart: str = "0"
    generation: int = 0

    @property
    def prefix(self) -> str:
        return f"ddpdoctor/{self.restart}/" + (f"g{self.generation}/" if self.generation else "")

    @property
    def control(self) -> str:
        return self.prefix + "control"

    @property
    def judge(self) -> str:
        return self.prefix + "judge"

    @property
    def acks(self) -> str:
        """Counts the ranks that obeyed a verdict."""
        return self.prefix + "acks"

    @property
    def released(self) -> str:
        """Set by the judge once it needs the store no more."""
        return self.prefix + "released"

    @property
    def let_go(self) -> str:
        """Counts the peers that stopped using a leaving host's store."""
        return self.prefix + "let-go"

    @property
    def report(self) -> str:
        """The judge's findings, for the ranks of other launchers."""
        return self.prefix + "report"

    def rank(self, rank: int) -> str:
        return f"{self.prefix}rank/{rank}"

    @property
    def job_namer(self) -> str:
        """Claimed by the first rank to start: that rank makes the job's report folder."""
        return self.prefix + "job-namer"

    @property
    def job(self) -> str:
        """The name of the job's report folder (`job-<n>`), set by the rank that claimed `job_namer`."""
        return self.prefix + "job"

    def chain(self, group: str, count: int) -> str:
        return f"{self.prefix}chain/{group}/{count}"
