"""A rank that cannot join its process group: `init_process_group` still running after --hang-after.

torch waits there for the group's timeout (30 minutes) without a word: a client retries a store nobody
listens on (a wrong MASTER_ADDR or MASTER_PORT, port 0, rank 0 never started), or the store is up and
waits for `world_size` ranks when fewer were started. Until the group exists there is no store to publish
through, so each rank watches its own call: a `JoinWatch` thread sleeps until --hang-after and, if the call
has not returned, writes what this rank is trying (`joining-<rank>.json` in `ddpdoctor run`'s run directory).
The first rank of the host to get there waits a moment for its siblings' files, reports for all of them,
and every stuck rank then leaves with exit code 1. A store that cannot be reached is the rendezvous's
configuration (F9, process-group-missing, as a missing MASTER_ADDR is); ranks that reach it and wait for
peers that never come are a hang at the group's first step (F6a, collective-timeout, as `explain` reads the
same wait once torch's timeout ends it). Without `ddpdoctor run` (`install()` in the program) there is no
run directory of this job alone, and each stuck rank reports for itself.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlparse

from ...advice import class_references
from ...callsite import is_user
from ...failsafe import swallowed
from ...findings import Evidence, Finding, Fix, Location, Severity
from ..config import ENV_RUN_DIR
from ..host import all_pids, environment_of, pid_alive, process_stopped, this_host
from ..protocol import Mark, RunDir, atomic_write_json, read_json

SIBLING_WAIT = 1.5  # how long the reporting rank waits for the other stuck ranks of its host to say so
PROBE_TIMEOUT = 2.0
# How much longer than --hang-after a rank that reaches its store waits for the ranks of this job that are
# still starting on this host (Lightning's re-launched workers import for seconds on a busy machine).
STARTING_GRACE = 60.0

UNREACHABLE = "process-group-missing"
WAITING = "collective-timeout"


@dataclass(frozen=True)
class JoinAttempt:
    """What one `init_process_group` call is trying, from its arguments and the environment."""

    rank: int | None
    world_size: int | None
    backend: str | None
    store: str | None  # "host:port"; None for a file:// rendezvous or a store the program made
    rendezvous: str  # "env://", "tcp://...", "file://...", "a store passed in"
    frame: tuple[str, int, str] | None  # the user's call: path, line, function
    thread_id: int = field(default_factory=threading.get_ident)
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class StartingPeer:
    """A process of this job on this host that will be a rank and has not said it is stuck joining."""

    pid: int
    rank: int


@dataclass(frozen=True)
class JoinState:
    """What a rank stuck in `init_process_group` says about itself (its `joining-<rank>.json`)."""

    attempt: JoinAttempt
    pid: int
    host: str
    waited: float  # seconds in init_process_group
    torch_frame: str | None  # the innermost torch function the call is in
    reachable: bool | None  # whether the store's address accepts connections (None: nothing to try)
    probe: str  # what the probe found, in words
    starting: tuple[StartingPeer, ...] = ()

    @property
    def rank(self) -> int | None:
        return self.attempt.rank

    def to_json(self) -> dict[str, Any]:
        attempt = self.attempt
        return {
            "rank": attempt.rank, "world_size": attempt.world_size, "backend": attempt.backend,
            "store": attempt.store, "rendezvous": attempt.rendezvous, "frame": attempt.frame,
            "thread_id": attempt.thread_id, "started": attempt.started, "pid": self.pid, "host": self.host,
            "waited": self.waited, "in": self.torch_frame, "reachable": self.reachable, "probe": self.probe,
            "starting": [{"pid": peer.pid, "rank": peer.rank} for peer in self.starting],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JoinState:
        """Raises KeyError, TypeError or ValueError for a file that is not a join state."""
        frame = data.get("frame")
        attempt = JoinAttempt(
            rank=_optional_int(data.get("rank")), world_size=_optional_int(data.get("world_size")),
            backend=data.get("backend"), store=data.get("store"), rendezvous=str(data["rendezvous"]),
            frame=(str(frame[0]), int(frame[1]), str(frame[2])) if frame else None,
            thread_id=int(data.get("thread_id", 0)), started=float(data.get("started", 0.0)),
        )
        return cls(
            attempt=attempt, pid=int(data["pid"]), host=str(data["host"]), waited=float(data["waited"]),
            torch_frame=data.get("in"), reachable=data.get("reachable"), probe=str(data.get("probe", "")),
            starting=tuple(StartingPeer(int(p["pid"]), int(p["rank"])) for p in data.get("starting") or ()),
        )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def attempt_from_call(
    init: Any, args: tuple, kwargs: dict, environ: Mapping[str, str], caller: Any
) -> JoinAttempt:
    bound = inspect.signature(init).bind_partial(*args, **kwargs).arguments

    def number(value: Any, variable: str) -> int | None:
        try:
            value = int(value)
        except (TypeError, ValueError):
            value = -1
        if value >= 0 and not (variable == "WORLD_SIZE" and value == 0):
            return value
        try:
            return int(environ[variable])
        except (KeyError, ValueError):
            return None

    init_method = bound.get("init_method")
    store = None
    if bound.get("store") is not None:
        rendezvous = "a store passed in"
    elif init_method is None or str(init_method).startswith("env://"):
        rendezvous = "env://"
        if environ.get("MASTER_ADDR") or environ.get("MASTER_PORT"):
            store = f"{environ.get('MASTER_ADDR', '')}:{environ.get('MASTER_PORT', '')}"
    else:
        rendezvous = str(init_method)
        parsed = urlparse(rendezvous)
        if parsed.scheme == "tcp" and parsed.hostname is not None:
            store = f"{parsed.hostname}:{parsed.port if parsed.port is not None else ''}"
    backend = bound.get("backend")
    frame = (
        (caller.f_code.co_filename, caller.f_lineno, caller.f_code.co_name) if caller is not None else None
    )
    return JoinAttempt(
        rank=number(bound.get("rank", -1), "RANK"),
        world_size=number(bound.get("world_size", -1), "WORLD_SIZE"),
        backend=None if backend is None else str(backend),
        store=store,
        rendezvous=rendezvous,
        frame=frame,
    )


def user_frame(start: Any) -> Any:
    """The innermost frame of the user's code from `start` outwards (Lightning's strategy makes the call
    for its users); `start` itself when every frame is a library's."""
    frame = start
    while frame is not None:
        if is_user(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return start


def probe(store: str | None) -> tuple[bool | None, str]:
    """Whether something accepts connections at the store's address (None: nothing to try)."""
    if not store:
        return None, "no address to try"
    from ...environment import check_rendezvous

    address, _, port = store.rpartition(":")
    found = check_rendezvous({"MASTER_ADDR": address, "MASTER_PORT": port}, timeout=PROBE_TIMEOUT)
    if found is None:
        return None, "no address to try"
    return found.reachable, found.detail


def torch_frame(thread_id: int) -> str | None:
    """The innermost torch function the joining thread is in (`_create_c10d_store`, ...)."""
    frame = sys._current_frames().get(thread_id)
    for current, _ in traceback.walk_stack(frame):
        if "torch" + os.sep + "distributed" in current.f_code.co_filename:
            return current.f_code.co_name
    return None


class JoinWatch(threading.Thread):
    """Sleeps for --hang-after next to one `init_process_group` call; reports if the call is still running."""

    def __init__(
        self, attempt: JoinAttempt, hang_after: float, run_dir: str | None, report_dir: str | None
    ) -> None:
        """`run_dir`: `ddpdoctor run`'s run directory (one per launcher), None outside it."""
        super().__init__(name="ddpdoctor-join-watch", daemon=True)
        self.attempt = attempt
        self.hang_after = hang_after
        self.run_dir = run_dir
        self.report_dir = report_dir
        self.joined = threading.Event()

    def finish(self) -> None:
        self.joined.set()

    def stop(self, timeout: float = 2.0) -> None:
        """For a test harness that stops the daemon threads a test leaves (see monitor_thread.py)."""
        self.finish()
        if self is not threading.current_thread():
            self.join(timeout)

    def run(self) -> None:
        # Counted in steps of at most a second, a longer gap counting as one: a job suspended (Ctrl-Z) for
        # longer than --hang-after has not waited that long in init_process_group.
        waited, last = 0.0, time.monotonic()
        while waited < self.hang_after:
            if self.joined.wait(min(1.0, self.hang_after - waited)):
                return
            now = time.monotonic()
            waited += min(now - last, 1.5)
            last = now
        try:
            self._report()
        except Exception as exc:  # noqa: BLE001 - the guard fails open: torch's own wait goes on
            swallowed("joining: the report of a stuck init_process_group", exc)
            print(
                f"[ddpdoctor] warning: could not report the stuck init_process_group ({exc!r})",
                file=sys.stderr,
            )

    def _report(self) -> None:
        attempt = self.attempt
        reachable, detail = probe(attempt.store)
        if self.joined.is_set():
            return  # joined while we probed
        state = JoinState(
            attempt,
            pid=os.getpid(),
            host=this_host(),
            waited=round(time.monotonic() - attempt.started, 1),
            torch_frame=torch_frame(attempt.thread_id),
            reachable=reachable,
            probe=detail,
        )
        run_dir = RunDir(self.run_dir) if self.run_dir is not None else None
        if run_dir is None:
            states = [state]
            reporter = True
        else:
            os.makedirs(run_dir.path, exist_ok=True)
            own = run_dir.joining(attempt.rank if attempt.rank is not None else os.getpid())
            atomic_write_json(own, state.to_json())
            if reachable is not False:
                # A peer still starting is no missing rank: wait for it (its own file says when it is stuck).
                starting = self._wait_for_starting_peers(run_dir)
                if self.joined.is_set():
                    run_dir.remove(own)
                    return
                state = replace(state, waited=round(time.monotonic() - attempt.started, 1), starting=starting)
                atomic_write_json(own, state.to_json())
            reporter = run_dir.claim(Mark.JOINING_CLAIM)
            if reporter:
                if self.joined.wait(SIBLING_WAIT):  # joined after all: no report, and another rank may claim
                    for leftover in (own, run_dir.mark_path(Mark.JOINING_CLAIM)):
                        run_dir.remove(leftover)
                    return
                states = read_states(run_dir.path)
        if reporter:
            from .publish import deliver_report  # the report's machinery, loaded when a rank is stuck

            deliver_report([joining_finding(states)], run_dir, self.report_dir, attempt.rank)
        elif run_dir is not None:
            # Until the report is on the terminal: this rank leaving makes the launcher (mp.spawn, torchrun)
            # stop the reporting one, maybe mid-print.
            _wait_for(run_dir.mark_path(Mark.PRINTED), timeout=10.0)
        if self.joined.is_set():
            return  # the group formed after all (the last rank arrived just now): training goes on
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


    def _wait_for_starting_peers(self, run_dir: RunDir) -> tuple[StartingPeer, ...]:
        """Waits while processes of this job on this host that will be ranks have not said they are stuck
        (at most STARTING_GRACE); the ones still starting then."""
        deadline = time.monotonic() + STARTING_GRACE
        while True:
            starting = starting_peers(run_dir.path, read_states(run_dir.path))
            if not starting or time.monotonic() >= deadline or self.joined.wait(1.0):
                return starting


def starting_peers(run_dir: str, stuck: list[JoinState]) -> tuple[StartingPeer, ...]:
    """This job's processes on this host that will be ranks (RANK or LOCAL_RANK in their environment, the
    same run directory) and have not written that they are stuck joining: still importing (a torchrun
    worker, a worker Lightning re-launched) or in init_process_group for less than --hang-after. A process
    with the rank of a stuck one is its child (forked before the call), not another rank."""
    stuck_pids = {s.pid for s in stuck}
    stuck_ranks = {str(s.rank) for s in stuck}
    ours = os.path.realpath(run_dir)
    found = []
    for pid in all_pids():
        if pid == os.getpid() or pid in stuck_pids:
            continue
        environ = environment_of(pid)
        if not environ or os.path.realpath(environ.get(ENV_RUN_DIR) or "/") != ours:
            continue
        rank = environ.get("RANK", environ.get("LOCAL_RANK"))
        if rank is None or rank in stuck_ranks or not pid_alive(pid) or process_stopped(pid):
            continue
        try:
            found.append(StartingPeer(pid, int(rank)))
        except ValueError:
            continue
    return tuple(found)


def read_states(run_dir: str) -> list[JoinState]:
    """The join states this host's stuck ranks wrote (a file half-written or of another kind is skipped)."""
    host = this_host()
    states = []
    for path in RunDir(run_dir).joining_files():
        data = read_json(path)
        if not isinstance(data, dict) or data.get("host") != host:
            continue
        try:
            states.append(JoinState.from_json(data))
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return states


def joining_finding(states: list[JoinState]) -> Finding:
    """One finding for every rank of this host that is stuck joining."""
    states = sorted(states, key=lambda s: (s.rank is None, s.rank or 0))
    first = states[0]
    unreachable = [s for s in states if s.reachable is False]
    message, fix = _message_and_fix(states, unreachable[0] if unreachable else None)
    rows, locations, evidence = _rank_rows(states)
    slug = UNREACHABLE if unreachable else WAITING
    return Finding(
        class_=slug,
        message=message,
        severity=Severity.ERROR,
        locations=tuple(locations),
        fix=Fix(fix),
        evidence=tuple(evidence),
        references=class_references(slug),
        facts={
            "stage": "store-unreachable" if unreachable else "waiting-for-ranks",
            "store": first.attempt.store,
            "rendezvous": first.attempt.rendezvous,
            "world_size": first.attempt.world_size,
            "backend": first.attempt.backend,
            "probe": first.probe,
            "ranks": rows,
        },
    )


def _message_and_fix(states: list[JoinState], unreachable: JoinState | None) -> tuple[str, str]:
    first = states[0]
    ranks = [s.rank for s in states if s.rank is not None]
    who = _ranks_text(ranks) if ranks else "this process"
    waited = max(s.waited for s in states)
    where = _where(first)
    world = first.attempt.world_size
    if unreachable is not None:
        message = (
            f"{who} cannot join the process group: the rendezvous store at {unreachable.attempt.store} "
            f"cannot be reached ({unreachable.probe}); init_process_group has been trying for {waited:.0f} "
            f"s{where}"
        )
        return message, _unreachable_fix(unreachable)
    arrived = f"; ranks started on this host: {', '.join(map(str, ranks))}" if ranks else ""
    starting = {peer.rank: peer.pid for s in states for peer in s.starting}
    if starting:
        arrived += "; started but not in init_process_group yet: " + ", ".join(
            f"rank {rank} (pid {pid})" for rank, pid in sorted(starting.items()))
    size = f"world_size is {world}{arrived}" if world else f"the rendezvous is {first.attempt.rendezvous}"
    message = (
        f"{who} {'has' if len(states) == 1 else 'have'} waited {waited:.0f} s in init_process_group{where} "
        f"for the rest of the group to join: {size}"
    )
    if starting:
        return message, (
            "The rank(s) named as started have not reached init_process_group: look at what they do before "
            "it (`py-spy dump --pid PID`, or their own output: a download, a lock, a slow import); the "
            "others wait for them"
        )
    fix = (
        f"Start as many ranks as world_size says ({world or 'N'}): `torchrun --nproc-per-node` times "
        "`--nnodes`, `mp.spawn(nprocs=...)`, your scheduler's task count; pass world_size/rank from the "
        "launcher's environment instead of hard-coding them, and check that every node of the job started"
    )
    return message, fix


def _rank_rows(states: list[JoinState]) -> tuple[dict[str, Any], list[Location], list[Evidence]]:
    """Per stuck rank: its row of the report's facts, its place, its line of evidence."""
    rows: dict[str, Any] = {}
    locations = []
    evidence = []
    for state in states:
        label = state.rank if state.rank is not None else state.pid
        doing = "connecting to the store" if state.reachable is False else "waiting for the other ranks"
        text = f"in init_process_group for {state.waited:.0f} s, {doing}"
        if state.attempt.store:
            text += f" at {state.attempt.store}"
        frame = state.attempt.frame
        stack = [[frame[0], frame[1], frame[2], None]] if frame else []
        rows[str(label)] = {"state": text, "where": None, "fingerprint": None, "metric": None, "stack": stack}
        if frame:
            locations.append(Location(frame[0], frame[1], rank=state.rank))
        evidence.append(
            Evidence(f"rank {label}: {text} (torch: {state.torch_frame or '?'})", rank=state.rank)
        )
    return rows, locations, evidence


def _unreachable_fix(state: JoinState) -> str:
    store = state.attempt.store or ""
    port = store.rpartition(":")[2]
    if port in ("", "0"):
        return (
            f"Give the store a real port: {store} has none a client can reach. With torchrun use "
            "`--standalone` "
            "(one node) or `--rdzv-endpoint HOST:PORT`; otherwise set MASTER_PORT to a free port on rank 0's "
            "node"
        )
    return (
        f"Make {store} the address and port where rank 0 (which hosts the store) listens: start rank 0, set "
        "MASTER_ADDR to its node's address as the other nodes resolve it (not localhost on a multi-node "
        "job), "
        "MASTER_PORT to a port free there, and open that port in the firewall between the nodes"
    )


def _where(state: JoinState) -> str:
    frame = state.attempt.frame
    if not frame:
        return ""
    from ...render.paths import short_path

    return f" at {short_path(frame[0])}:{frame[1]} in {frame[2]}"


def _ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _wait_for(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
