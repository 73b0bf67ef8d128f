"""What a rank publishes about itself and what the judge reads: typed, frozen records, one JSON encoding each.

A `CallRecord` is one collective as one rank issued it: the store record, the flight file, the report's
`rank-<r>.jsonl` and the decisions all read this one type. A `RankRecord` is one rank's state as its
monitor publishes it at a heartbeat, or as it is rebuilt from the files a rank left behind. Nothing
changes a record once built: what the judge or the launcher learns later (a dead rank's wait status, a
flight file read after the fact) makes a new record with `dataclasses.replace`.

The JSON forms are what docs/guard.md documents; `RECORD_VERSION` goes up when a field changes meaning.
The hot path never builds these (it keeps `fingerprint.CollectiveFingerprint`, slots and no checks); a
monitor turns its fingerprints into records only when it publishes them.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

RECORD_VERSION = 1

# Compared across ranks; devices and call sites are not (cuda:0 vs cuda:1 and different lines are legitimate).
COMPARED = ("op", "reduce_op", "root", "shapes", "dtypes")

# A report directory holds each job's rank logs in a folder of its own, `job-<n>/rank-<r>.jsonl`, n counting
# the jobs that wrote there (a command that runs two torchruns, a pytest session's groups); report.json at
# the top holds every job's findings. A directory from before jobs had folders has its logs at the top.
JOB_FOLDER = re.compile(r"^job-(\d+)$")


class Frame(NamedTuple):
    """One stack frame: JSON `[path, line, function, library-or-null]`."""

    path: str
    line: int
    function: str
    # distribution-ish name ("lightning", "torch.distributed.fsdp", "python"); None: user code
    library: str | None

    def short(self) -> str:
        return f"{self.path}:{self.line}"

    def to_list(self) -> list:
        return [self.path, self.line, self.function, self.library]

    @classmethod
    def from_json(cls, value: Any) -> Frame | None:
        if not isinstance(value, (list, tuple)) or len(value) < 3:
            return None
        try:
            line = int(value[1])
        except (TypeError, ValueError):
            return None
        library = value[3] if len(value) > 3 and value[3] is not None else None
        return cls(str(value[0]), line, str(value[2]), None if library is None else str(library))


def frames_from_json(values: Any) -> tuple[Frame, ...]:
    return tuple(frame for frame in (Frame.from_json(v) for v in values or ()) if frame is not None)


class MetricOrigin(NamedTuple):
    """The Lightning metric a sync collective is for, and where `self.log(..., sync_dist=True)` logged it."""

    name: str
    path: str | None
    line: int | None
    hook: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "line": self.line, "hook": self.hook}

    @classmethod
    def from_json(cls, value: Any) -> MetricOrigin | None:
        if not isinstance(value, Mapping) or not value.get("name"):
            return None
        line = value.get("line")
        return cls(str(value["name"]), value.get("path"), int(line) if isinstance(line, int) else None,
                   value.get("hook"))


class ModelPasses(NamedTuple):
    """A wrapped root module's passes on one rank (audits/forward_counts.py, audits/backward_counts.py): its
    class name, the wrapper (`fully_shard`, `FullyShardedDataParallel`, `DistributedDataParallel`), the
    forward count and the user's line of the last call; the process's `backward()` calls since the root was
    wrapped and the user's line of the last one."""

    name: str
    wrapper: str
    forwards: int
    path: str | None = None
    line: int | None = None
    backwards: int = 0
    backward_path: str | None = None
    backward_line: int | None = None

    def to_list(self) -> list[Any]:
        out = [self.name, self.wrapper, self.forwards, self.path, self.line]
        if self.backwards:
            out += [self.backwards, self.backward_path, self.backward_line]
        return out

    @classmethod
    def from_json(cls, value: Any) -> ModelPasses | None:
        if not isinstance(value, list) or len(value) not in (5, 8) or not isinstance(value[2], int):
            return None
        line = value[4] if isinstance(value[4], int) else None
        path = value[3] if isinstance(value[3], str) else None
        if len(value) == 5 or not isinstance(value[5], int):
            return cls(str(value[0]), str(value[1]), value[2], path, line)
        backward_path = value[6] if isinstance(value[6], str) else None
        backward_line = value[7] if isinstance(value[7], int) else None
        return cls(str(value[0]), str(value[1]), value[2], path, line, value[5], backward_path, backward_line)


class CallState(str, enum.Enum):
    """Where a rank is with one collective."""

    IN = "in"  # entered, not returned (or its async Work not completed)
    DONE = "done"
    FAILED = "failed"  # raised


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One collective as one rank issued it: what every rank of the group must agree on (`COMPARED`), its
    place (the group's sequence number, this rank's own count `index`) and where it came from."""

    index: int
    group: str
    seq: int
    op: str
    reduce_op: str | None = None
    root: int | None = None
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    site: Frame | None = None  # the user's line
    library: Frame | None = None  # the library frame that issued it (Lightning, FSDP, accelerate)
    time: float = 0.0  # seconds since the epoch, when it was entered
    state: CallState = CallState.IN
    metric: MetricOrigin | None = None
    roles: tuple[str, ...] = ()  # per shape: "in", "out" or "" (in place); empty when not known

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index, "group": self.group, "seq": self.seq, "op": self.op,
            "reduce_op": self.reduce_op, "root": self.root, "shapes": [list(s) for s in self.shapes],
            "dtypes": list(self.dtypes), "devices": list(self.devices),
            "site": self.site.to_list() if self.site else None,
            "library": self.library.to_list() if self.library else None,
            "time": round(self.time, 6), "state": self.state.value,
        }
        if self.roles:
            out["roles"] = list(self.roles)
        if self.metric is not None:
            out["metric"] = self.metric.to_dict()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CallRecord:
        """A record from its JSON object; missing optional keys take their defaults (a flight slot holds no
        metric, a chain checkpoint no time)."""
        state = data.get("state")
        root = data.get("root")
        return cls(
            index=_int(data.get("index"), 0),
            group=str(data.get("group") if data.get("group") is not None else ""),
            seq=_int(data.get("seq"), -1),
            op=str(data.get("op") or "?"),
            reduce_op=None if data.get("reduce_op") is None else str(data["reduce_op"]),
            root=root if isinstance(root, int) else None,
            shapes=tuple(tuple(int(d) for d in shape) for shape in data.get("shapes") or ()
                         if isinstance(shape, (list, tuple))),
            dtypes=tuple(str(d) for d in data.get("dtypes") or ()),
            devices=tuple(str(d) for d in data.get("devices") or ()),
            site=Frame.from_json(data.get("site")),
            library=Frame.from_json(data.get("library")),
            time=float(data.get("time") or 0.0),
            state=CallState(state) if state in ("in", "done", "failed") else CallState.IN,
            metric=MetricOrigin.from_json(data.get("metric")),
            roles=tuple(str(r) for r in data.get("roles") or ()),
        )

    @property
    def failed(self) -> bool:
        return self.state is CallState.FAILED

    @property
    def position(self) -> tuple[str, int]:
        """Where the ranks' calls meet: a group's sequence number (each group counts its own)."""
        return (self.group, self.seq)


class RankState(str, enum.Enum):
    """A rank's life as it (or the launcher, or the judge) publishes it."""

    RUNNING = "running"
    EXITED = "exited"  # finished its script or destroyed its process group
    DEAD = "dead"  # its process is gone without saying it exited
    STOPPED = "stopped"  # the launcher stopped it after another rank died (set by `ddpdoctor run` only)


class RankStatus(str, enum.Enum):
    """What the judge concludes a rank is doing, for the report's row: derived from its record, and the
    only thing decisions and the monitor look at (the row's text is made from it, never read back)."""

    IN_COLLECTIVE = "in-collective"
    FAILED_IN_COLLECTIVE = "failed-in-collective"
    RUNNING = "running"  # running Python, not in a collective
    IN_BACKWARD = "in-backward"  # where DDP's gradient all_reduce runs, from C++
    IN_COMPILED_GRAPH = "in-compiled-graph"  # torch.compile: its collectives are not seen one by one
    NOT_RESPONDING = "not-responding"  # heartbeats stopped, process still there
    EXITED = "exited"
    DEAD = "dead"
    STOPPED = "stopped"  # by the launcher
    NO_RECORD = "no-record"  # never published one

    @property
    def gone(self) -> bool:
        """Whether the rank can no longer take part (nobody waits for its acknowledgement of a verdict)."""
        return self in (RankStatus.EXITED, RankStatus.DEAD, RankStatus.NO_RECORD)


@dataclass(frozen=True)
class RankRecord:
    """One rank's state. `recent`, `python_seqs` and `stack` are published only while someone suspects a
    hang (None / empty on an ordinary heartbeat); the fields after `stack` are learned by whoever reads
    the record (the judge, the launcher), never published by the rank itself."""

    rank: int
    pid: int | None = None
    host: str | None = None
    hb: int = 0  # heartbeats published so far
    state: RankState = RankState.RUNNING
    current: CallRecord | None = None  # the collective it is in (or failed in)
    waited: float | None = None  # seconds in `current`
    seqs: Mapping[str, int] = field(default_factory=dict)  # each group's sequence number, C++ calls included
    flight: str | None = None  # its flight file's path
    error: str | None = None  # the error it dies of, or its failed collective raised
    gave_up: bool = False  # it called `sys.exit(<non-zero>)` from the user's code (`error` says the status)
    metric: MetricOrigin | None = None  # the Lightning metric being synced
    recent: tuple[CallRecord, ...] | None = None  # completed collectives, oldest first; None: not published
    python_seqs: Mapping[str, tuple[int, ...]] | None = (
        None  # per group, the Python-issued seqs its ring holds
    )
    history_complete: bool = False  # its ring holds every call since the group began
    groups: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # members of its non-default groups
    stack: tuple[Frame, ...] = ()  # its main thread's, innermost first
    # seconds since its main thread last moved (rank/progress.py); None: never seen moving
    still_for: float | None = None
    # its main thread has not been sampled twice yet (a monitor that started or was starved of the CPU a
    # moment ago): whether it is slow or stuck is not known yet
    progress_unknown: bool = False
    passes: tuple[ModelPasses, ...] = ()  # its wrapped roots' forward passes
    # learned by the reader:
    exit_status: int | None = None  # the wait status of its dead process, if seen while it was a zombie
    signal: str | None = None  # the fatal signal its fault log names
    died_here: bool = False  # `stack` is where it crashed (its fault log's)
    silent: float | None = None  # seconds without a heartbeat, for a rank not (yet) dead
    process_stopped: bool = False  # its process is stopped (SIGSTOP, a debugger)

    @property
    def last(self) -> CallRecord | None:
        """The collective it is in, else the last it completed."""
        if self.current is not None:
            return self.current
        return self.recent[-1] if self.recent else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": RECORD_VERSION, "rank": self.rank, "pid": self.pid, "host": self.host, "hb": self.hb,
            "state": self.state.value, "current": self.current.to_json() if self.current else None,
            "waited": self.waited, "seqs": dict(self.seqs), "flight": self.flight, "error": self.error,
        }
        if self.metric is not None:
            out["metric"] = self.metric.to_dict()
        if self.recent is not None:
            out["recent"] = [call.to_json() for call in self.recent]
        if self.python_seqs is not None:
            out["python_seqs"] = {group: list(seqs) for group, seqs in self.python_seqs.items()}
            out["history_complete"] = self.history_complete
        if self.groups:
            out["groups"] = {name: list(members) for name, members in self.groups.items()}
        if self.stack:
            out["stack"] = [frame.to_list() for frame in self.stack]
        if self.passes:
            out["passes"] = [passes.to_list() for passes in self.passes]
        for name in ("exit_status", "signal", "silent", "still_for"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.died_here:
            out["died_here"] = True
        if self.gave_up:
            out["gave_up"] = True
        if self.process_stopped:
            out["process_stopped"] = True
        if self.progress_unknown:
            out["progress_unknown"] = True
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankRecord:
        state = data.get("state")
        current = data.get("current")
        recent = data.get("recent")
        python_seqs = data.get("python_seqs")
        waited = data.get("waited")
        return cls(
            rank=_int(data.get("rank"), -1),
            pid=data.get("pid") if isinstance(data.get("pid"), int) else None,
            host=data.get("host"),
            hb=_int(data.get("hb"), 0),
            state=RankState(state) if state in RankState._value2member_map_ else RankState.RUNNING,
            current=CallRecord.from_json(current) if isinstance(current, Mapping) else None,
            waited=float(waited) if isinstance(waited, (int, float)) else None,
            seqs={str(k): int(v) for k, v in (data.get("seqs") or {}).items()},
            flight=data.get("flight"),
            error=data.get("error"),
            metric=MetricOrigin.from_json(data.get("metric")),
            recent=calls_from_json(recent) if isinstance(recent, list) else None,
            python_seqs=(
                {str(k): tuple(v) for k, v in python_seqs.items()}
                if isinstance(python_seqs, Mapping)
                else None
            ),
            history_complete=bool(data.get("history_complete")),
            groups={str(k): tuple(v) for k, v in (data.get("groups") or {}).items()},
            stack=frames_from_json(data.get("stack")),
            exit_status=data.get("exit_status") if isinstance(data.get("exit_status"), int) else None,
            signal=data.get("signal"),
            died_here=bool(data.get("died_here")),
            gave_up=bool(data.get("gave_up")),
            silent=data.get("silent"),
            passes=tuple(p for p in map(ModelPasses.from_json, data.get("passes") or ()) if p is not None),
            still_for=(float(data["still_for"]) if isinstance(data.get("still_for"), (int, float)) else None),
            process_stopped=bool(data.get("process_stopped")),
            progress_unknown=bool(data.get("progress_unknown")),
        )


@dataclass(frozen=True)
class ExitRecord:
    """`rank-<r>.exit.json`: what a rank says as it leaves: the error it dies of and the stack where it was
    raised (innermost first), or that it left on its own; and every group's sequence number then."""

    error: str | None = None
    seqs: Mapping[str, int] | None = None
    stack: tuple[Frame, ...] | None = None
    exited: bool = False
    gave_up: bool = False  # the error is a `sys.exit(<non-zero>)` from the user's code

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"v": RECORD_VERSION}
        if self.exited:
            out["exited"] = True
        if self.error is not None:
            out["error"] = self.error
        if self.gave_up:
            out["gave_up"] = True
        if self.seqs is not None:
            out["seqs"] = dict(self.seqs)
        if self.stack is not None:
            out["stack"] = [frame.to_list() for frame in self.stack]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExitRecord:
        seqs = data.get("seqs")
        return cls(
            error=str(data["error"]) if data.get("error") is not None else None,
            seqs={str(k): int(v) for k, v in seqs.items()} if isinstance(seqs, Mapping) else None,
            stack=frames_from_json(data["stack"]) if isinstance(data.get("stack"), list) else None,
            exited=bool(data.get("exited")),
            gave_up=bool(data.get("gave_up")),
        )


def calls_from_json(values: Iterable[Any]) -> tuple[CallRecord, ...]:
    return tuple(CallRecord.from_json(v) for v in values if isinstance(v, Mapping))


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class RankMeta:
    """`rank-<r>.meta.json`: who a rank is, left at its start for the launcher and for peers that read its
    files (a rank's process may be gone by the time they look)."""

    rank: int
    pid: int
    host: str | None
    world_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": self.pid, "host": self.host, "world_size": self.world_size}

    @classmethod
    def from_json(cls, data: Any) -> RankMeta | None:
        """None for a file that is not (or not yet: being written) a rank's meta."""
        if not isinstance(data, Mapping):
            return None
        rank, pid, world_size = data.get("rank"), data.get("pid"), data.get("world_size")
        if (
            not isinstance(rank, int)
            or not isinstance(pid, int)
            or isinstance(rank, bool)
            or isinstance(pid, bool)
        ):
            return None
        host = data.get("host")
        return cls(rank, pid, str(host) if host is not None else None,
                   world_size if isinstance(world_size, int) else None)
