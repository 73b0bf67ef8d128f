"""The monitor thread of one rank: heartbeat, publish, judge on suspicion, report, stop the job.

Per heartbeat each rank does two store operations: `get` of the job's control key and `set` of its own
record. Only while a rank has waited in a collective longer than the grace period does anything read
the peers' records, and then only one rank (the *judge*, elected with `compare_set`) reads all of them.
The store is a separate client connection to the job's existing rendezvous store (no new server,
no new port), so the training thread never waits behind the monitor's traffic.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from ..findings import dumps, loads
from .consensus import ChainCheck, first_difference, segment_calls
from .fingerprint import describe, differences
from .host import hosts_store, pid_alive, process_stopped, this_host, zombie_status
from .lightning_metrics import metric_in_stack
from .model import CallRecord, RankRecord, RankState, RankStatus
from .places import location_of, where
from .publish import REPORTED_MARK, adopt_report, publish_report, report_findings, stop_process, write_own_log
from .rank_rows import RankRow
from .records import (
    RECENT,
    exception_stack,
    failed_alike,
    merge_flight_files,
    records_from_run_dir,
    refresh_from_flight,
    short_error,
    write_exit_record,
)
from .verdict import Decision, Verdict, decide, mismatch_headline

STALL_AFTER = 2.0  # seconds a heartbeat may wake late before this process counts as having been stopped


class StoreLink:
    """The guard's keys in the rendezvous store, over its own client connection."""

    def __init__(self, timeout: float, generation: int = 0) -> None:
        import torch.distributed.distributed_c10d as c10d

        store = c10d._get_default_store()
        base: Any = getattr(store, "_underlying_non_prefix_store", None) or store
        try:
            self.store = base.clone()
        except Exception:  # noqa: BLE001 - stores without clone (FileStore, HashStore) are thread safe enough
            self.store = base
        try:
            self.store.set_timeout(datetime.timedelta(seconds=timeout))
        except Exception:  # noqa: BLE001
            pass
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        # generation: a process that destroys its default group and makes a new one starts on fresh keys
        self.prefix = f"ddpdoctor/{restart}/" + (f"g{generation}/" if generation else "")
        self.control = self.prefix + "control"
        self.judge = self.prefix + "judge"
        self.acks = self.prefix + "acks"
        self.released = self.prefix + "released"  # set by the judge once it needs the store no more
        self.let_go = self.prefix + "let-go"  # counts the peers that stopped using a leaving host's store
        self.report = self.prefix + "report"  # the judge's findings, for the ranks of other launchers

    def key(self, rank: int) -> str:
        return f"{self.prefix}rank/{rank}"

    def init(self) -> None:
        self.store.compare_set(self.control, "", "idle")

    def publish(self, rank: int, record: RankRecord) -> None:
        self.store.set(self.key(rank), json.dumps(record.to_json(), separators=(",", ":"), default=str))

    def read_control(self) -> str:
        return self.store.get(self.control).decode()

    def read(self, rank: int) -> RankRecord | None:
        try:
            return RankRecord.from_json(json.loads(self.store.get(self.key(rank))))
        except (ValueError, AttributeError):
            return None

    def read_all(self, world_size: int) -> dict[int, RankRecord]:
        keys = [self.key(r) for r in range(world_size)]
        present = keys if self.store.check(keys) else [k for k in keys if self.store.check([k])]
        out: dict[int, RankRecord] = {}
        if not present:
            return out
        for key, value in zip(present, self.store.multi_get(present), strict=True):
            try:
                out[int(key.rsplit("/", 1)[1])] = RankRecord.from_json(json.loads(value))
            except (ValueError, AttributeError):
                continue
        return out


class RankMonitor(threading.Thread):
    def __init__(self, runtime: Any) -> None:
        super().__init__(name="ddpdoctor-monitor", daemon=True)
        self.runtime = runtime
        self.config = runtime.config
        self.rank: int = runtime.rank
        self.world_size: int = runtime.world_size
        self.host = this_host()
        self.heartbeats = 0
        self.is_judge = False
        self.state = RankState.RUNNING
        # Not `_stop`: that is a method of threading.Thread, which CPython calls in a forked child (a
        # DataLoader worker), and an Event there made every fork print a TypeError.
        self._stopping = threading.Event()
        self._peer_seen: dict[int, tuple[int, float]] = {}
        self._lock = threading.Lock()
        self.chain: ChainCheck = runtime.chain
        self.link: StoreLink | None = None
        self.link = StoreLink(timeout=max(5.0, 6 * self.config.heartbeat), generation=runtime.generation)
        self.link.init()
        self._write_meta()
        # Published once from the caller's thread, so that a rank that dies within milliseconds (gloo's
        # SIGABRT on a size mismatch) has left its pid and flight-file path behind.
        self.link.publish(self.rank, self.record(with_stack=False))

    # ---- what this rank says about itself -----------------------------------------------------------
    def _write_meta(self) -> None:
        run_dir = self.runtime.run_dir
        meta = {"rank": self.rank, "pid": os.getpid(), "host": self.host, "world_size": self.world_size}
        with open(os.path.join(run_dir, f"rank-{self.rank}.meta.json"), "w", encoding="utf-8") as handle:
            json.dump(meta, handle)

    def main_frame(self) -> Any:
        return sys._current_frames().get(self.runtime.main_thread_id)

    def record(self, *, with_stack: bool, error: str | None = None) -> RankRecord:
        """This rank's state. Small on ordinary heartbeats; `with_stack` (only while someone is suspicious)
        adds the recent calls, the main thread's stack and the Lightning metric being synced."""
        runtime = self.runtime
        held = runtime.waiting()
        current = held[0] if held is not None else None
        record = RankRecord(
            rank=self.rank, pid=os.getpid(), host=self.host, hb=self.heartbeats, state=self.state,
            current=current.record() if current is not None else None,
            waited=round(time.monotonic() - held[1], 3) if held is not None else None,
            seqs=runtime.sequence_numbers(), flight=runtime.flight.path if runtime.flight else None, error=error,
            metric=current.metric if current is not None else None,
        )
        if not with_stack:
            return record
        return self._with_history(record, current)

    def _with_history(self, record: RankRecord, current: Any) -> RankRecord:
        from .callsite import stack_of

        recent = list(self.runtime.ring)[-RECENT:]
        python_seqs, complete = self.runtime.python_history()
        frame = self.main_frame()
        metric = metric_in_stack(frame) if frame is not None else None
        return replace(
            record,
            recent=tuple(fp.record() for fp in recent if fp is not current),
            python_seqs={group: tuple(seqs) for group, seqs in python_seqs.items()}, history_complete=complete,
            groups=self._group_members(),
            stack=tuple(stack_of(frame)) if frame is not None else (),
            metric=metric or record.metric,
        )

    def _group_members(self) -> dict[str, tuple[int, ...]]:
        import torch.distributed as dist

        out = {}
        for group, info in list(self.runtime.groups.items()):
            if group is self.runtime.default_group:
                continue
            try:
                out[info.name] = tuple(dist.get_process_group_ranks(group))
            except Exception:  # noqa: BLE001
                pass
        return out

    # ---- the loop -----------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            # Import the renderer now, off the training thread, so a verdict prints without delay.
            import rich.console  # noqa: F401
            import rich.panel  # noqa: F401
            import rich.table  # noqa: F401
        except ImportError:
            pass
        try:
            from .config import scratch_dir
            from .leftovers import sweep

            sweep(scratch_dir(), keep=self.runtime.run_dir)  # earlier jobs' files, in this thread: off the hot path
        except Exception:  # noqa: BLE001 - housekeeping only
            pass
        try:
            while True:
                wait = self._next_wait()
                due = time.monotonic() + wait
                if self._stopping.wait(wait):
                    break
                self._note_stall(time.monotonic() - due)
                self.tick()
        except Exception as exc:  # noqa: BLE001 - the store vanished, or a guard bug: fail open
            if not self._stopping.is_set():
                self.runtime.fail_open(exc)

    def _next_wait(self) -> float:
        """A heartbeat, or less: wake up right when the collective in progress passes the grace period."""
        wait = self.config.heartbeat
        held = self.runtime.waiting()
        if held is not None:
            remaining = held[1] + self.config.grace - time.monotonic()
            if 0 < remaining < wait:
                wait = remaining + 0.01
        return wait

    def _note_stall(self, late: float) -> None:
        """A heartbeat that woke far later than asked did not run: the process was stopped (Ctrl-Z, SIGSTOP)
        or the machine suspended, since a rank waiting in a collective holds no GIL that could keep this
        thread off. Waits and peers' silences then count from now (see GuardRuntime.waiting)."""
        if late > max(STALL_AFTER, 2 * self.config.heartbeat):
            self.runtime.resumed = time.monotonic()

    def stop(self, *, exited: bool, quiet: bool = False, at_interpreter_exit: bool = False) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        if exited and self.link is not None:
            fatal = self.runtime.fatal
            self.state = RankState.DEAD if fatal is not None else RankState.EXITED
            if not self._lock.acquire(timeout=2 * self.config.heartbeat + 6):
                return
            try:
                record = self.record(with_stack=True, error=short_error(fatal) if fatal is not None else None)
                if fatal is not None:  # where it raised, not the interpreter's exit handlers
                    record = replace(record, stack=exception_stack(fatal))
                elif at_interpreter_exit:  # the main thread runs only exit handlers: the user's frames are gone
                    record = replace(record, stack=())
                self.link.publish(self.rank, record)
                self.check_chain(final=True)
                if hosts_store(self.link.store):
                    self._leave_store()
            except Exception:  # noqa: BLE001 - the store may already be gone at shutdown
                pass
            finally:
                self._lock.release()

    def _failed_alike(self, records: dict[int, RankRecord], own: RankRecord) -> bool:
        return failed_alike({**records, self.rank: own}, self.world_size)

    def _leave_store(self) -> None:
        """This process hosts the store (rank 0 under mp.spawn or Lightning's launcher) and is leaving
        while peers still run, as a clean job that skips destroy_process_group does: their monitors'
        next store call would fail, and torch prints a C++ stack trace for it. Tell them through the
        control key and wait (two heartbeats at most) until they have let go of the store."""
        assert self.link is not None
        records = self.link.read_all(self.world_size)
        running = [r for r in range(self.world_size)
                   if r != self.rank and (r not in records or records[r].state is not RankState.EXITED)]
        if not running or self.link.store.compare_set(self.link.control, "idle", "leaving").decode() != "leaving":
            return  # nobody left to tell, or a rank waits or reported: its verdict needs no help from here
        deadline = time.monotonic() + 2 * self.config.heartbeat + 1.0
        while time.monotonic() < deadline and self.link.store.add(self.link.let_go, 0) < len(running):
            time.sleep(0.05)

    def tick(self) -> None:
        assert self.link is not None
        with self._lock:
            self.heartbeats += 1
            control = self.link.read_control()
            if control.startswith("verdict"):
                self.obey(control)
                return
            if control == "leaving":  # the rank hosting the store finished: cross-rank checks end here
                self.link.store.add(self.link.let_go, 1)
                self.link = None
                self._stopping.set()
                return
            runtime = self.runtime
            held = runtime.waiting()
            waiting = held is not None and time.monotonic() - held[1] >= self.config.grace
            self.link.publish(self.rank, self.record(with_stack=waiting or control == "suspect"))
            self.check_chain()
            if waiting:
                if control == "idle":
                    self.link.store.compare_set(self.link.control, "idle", "suspect")
                if self.claim_judge():
                    self.judge()
            elif self.is_judge:
                self.is_judge = False
                self.link.store.compare_set(self.link.judge, str(self.rank), "")
                self.link.store.compare_set(self.link.control, "suspect", "idle")

    def check_chain(self, final: bool = False) -> None:
        """Compare this rank's completed collectives with the first rank's at each checkpoint."""
        if self.link is None:
            return
        self.chain.fold(self.runtime.current)
        if final:
            self.chain.flush()
        mismatch = self.chain.publish(self.link.store, self.link.prefix)
        if mismatch is None:
            return
        ours, theirs = mismatch
        pair = first_difference(ours, theirs)
        if pair is None:
            ours_calls, theirs_calls = segment_calls(ours), segment_calls(theirs)
            if not ours_calls or not theirs_calls:
                return
            pair = ours_calls[-1], theirs_calls[-1]
        mine: tuple[int, CallRecord] = (self.rank, pair[0])
        other: tuple[int, CallRecord] = (int(theirs["rank"]), pair[1])
        first, second = sorted([mine, other], key=lambda item: item[0])
        diff = differences(first[1], second[1])
        headline = mismatch_headline(first, second, diff, completed=True)
        rows = {rank: RankRow(RankStatus.RUNNING, f"passed {describe(call)}", where(call), call=call,
                              location=location_of(call, None, ()))
                for rank, call in (first, second)}
        verdict = Verdict(Decision.COMPLETED_MISMATCH, headline, rows, first[1].group, first[1].seq,
                          mismatch=tuple(diff))
        self.announce(verdict, {})

    def claim_judge(self) -> bool:
        assert self.link is not None
        mine = str(self.rank)
        holder = self.link.store.compare_set(self.link.judge, "", mine).decode()
        if holder != mine and holder:
            # Take over from a judge that stopped heartbeating (died, or its process is stuck): its
            # record's heartbeat count is read here, since only a judge reads every record.
            record = self.link.read(int(holder))
            if self._silent_for(int(holder), record.hb if record is not None else 0) > self.config.dead_after:
                holder = self.link.store.compare_set(self.link.judge, holder, mine).decode()
        self.is_judge = holder == mine
        return self.is_judge

    def _silent_for(self, rank: int, hb: int) -> float:
        """Seconds since this monitor saw `rank`'s heartbeat count change (0 the first time it looks), not
        counting the time before this process last resumed from a stop (the peer was likely stopped too)."""
        now = time.monotonic()
        seen = self._peer_seen.get(rank)
        if seen is None or seen[0] != hb:
            self._peer_seen[rank] = (hb, now)
            return 0.0
        return now - max(seen[1], self.runtime.resumed)

    def _dead(self, records: dict[int, RankRecord]) -> set[int]:
        dead = set()
        for rank in range(self.world_size):
            record = records.get(rank)
            if record is None or rank == self.rank:
                continue
            silent = self._silent_for(rank, record.hb)
            if record.state is RankState.EXITED:
                continue
            if record.host == self.host and record.pid:
                # On the same host the process itself is the evidence: a rank whose monitor went quiet
                # (it failed open, or a C extension holds the GIL) but whose process runs is not dead.
                if not pid_alive(record.pid):
                    dead.add(rank)
            elif silent > self.config.dead_after:
                dead.add(rank)
        return dead

    def _with_exit_statuses(self, records: dict[int, RankRecord], dead: set[int]) -> dict[int, RankRecord]:
        """The wait status of each dead rank of this host, readable until its parent reaps it."""
        out = dict(records)
        for rank in dead:
            record = records.get(rank)
            if record is not None and record.host == self.host and record.pid:
                status = zombie_status(record.pid)
                if status is not None:
                    out[rank] = replace(record, exit_status=status)
        return out

    def _with_silences(self, records: dict[int, RankRecord], dead: set[int]) -> dict[int, RankRecord]:
        """A peer whose heartbeat stopped but is not dead (yet): say so, its record is stale."""
        out = dict(records)
        for rank, record in records.items():
            if rank == self.rank or rank in dead or rank not in self._peer_seen:
                continue
            silent = self._silent_for(rank, record.hb)
            if silent > 3 * self.config.heartbeat + 1.0:
                stopped = record.host == self.host and bool(record.pid) and process_stopped(int(record.pid or 0))
                out[rank] = replace(record, silent=round(silent, 1), process_stopped=stopped)
        return out

    def judge(self) -> None:
        assert self.link is not None
        records = self.link.read_all(self.world_size)
        dead = self._dead(records)
        records = self._with_silences(self._with_exit_statuses(records, dead), dead)
        records = merge_flight_files(records, dead, self.host)
        verdict = decide(records, self.world_size, dead=dead, grace=self.config.grace, hang_after=self.config.hang_after)
        if verdict is not None:
            self.announce(verdict, records)

    # ---- after a verdict ----------------------------------------------------------------------------
    def announce(self, verdict: Verdict, records: dict[int, RankRecord]) -> None:
        """Claim the verdict; the winner prints the one report and writes it; then this rank stops."""
        assert self.link is not None
        mine = f"verdict:{self.rank}"
        control = self.link.read_control()
        if control.startswith("verdict"):
            self.obey(control)
            return
        # The control key may move between idle and suspect under us: claim against what it holds now,
        # until it holds our verdict or someone else's.
        for _ in range(20):
            control = self.link.store.compare_set(self.link.control, control, mine).decode()
            if control == mine or control.startswith("verdict"):
                break
        if control != mine:
            if control.startswith("verdict"):
                self.obey(control)
            return  # not claimed (the key would not hold still): decided again at the next heartbeat
        try:  # before this rank prints: the ranks of other launchers (other nodes) take it from here
            self.link.store.set(self.link.report, json.dumps(
                {"run_dir": self.runtime.run_dir, "findings": dumps(report_findings(verdict, self.runtime))}))
        except Exception:  # noqa: BLE001 - they then judge from their own files, as before
            pass
        publish_report(verdict, self.runtime, records)
        # Let the peers see the verdict (this process may host the store) before going.
        deadline = time.monotonic() + max(2.0, 4 * self.config.heartbeat)
        gone = [r for r, row in verdict.rows.items() if r != self.rank and row.status.gone]
        alive = self.world_size - 1 - len(gone)
        while time.monotonic() < deadline:
            try:
                if self.link.store.add(self.link.acks, 0) >= alive:
                    break
            except Exception:  # noqa: BLE001
                break
            time.sleep(0.05)
        try:
            self.link.store.set(self.link.released, "1")
        except Exception:  # noqa: BLE001
            pass
        stop_process(self.runtime, 1)

    def obey(self, control: str) -> None:
        judge = control.split(":", 1)[1] if ":" in control else "?"
        self.runtime.current = None
        write_own_log(self.runtime)
        print(f"[ddpdoctor] rank {self.rank}: stopping; rank {judge} reported the job's failure", file=sys.stderr, flush=True)
        adopt_report(self.runtime, self._judges_report)
        try:
            assert self.link is not None
            self.link.store.add(self.link.acks, 1)
            # This process may host the store (rank 0 under Lightning's launcher or mp.spawn): leaving
            # now would cut the judge off while it counts the acks, and torch would print a "Connection
            # reset by peer" stack trace under the report. One blocking wait, so that a judge that hosts
            # the store and leaves right after releasing it is not polled after it has gone.
            self.link.store.wait([self.link.released], datetime.timedelta(seconds=max(2.0, 4 * self.config.heartbeat) + 1.0))
        except Exception:  # noqa: BLE001
            pass
        stop_process(self.runtime, 1)

    def _judges_report(self) -> list[Any] | None:
        """The findings the judge shared, unless it wrote them into this rank's own run directory."""
        try:
            assert self.link is not None
            self.link.store.wait([self.link.report], datetime.timedelta(seconds=2))
            shared = json.loads(self.link.store.get(self.link.report))
            if shared.get("run_dir") == self.runtime.run_dir:
                return None
            return loads(shared["findings"])
        except Exception:  # noqa: BLE001 - the store is gone with the judge, or the value is not ours
            return None

    def post_mortem(self, fp: Any, exc: BaseException) -> None:
        """A collective raised in the caller's thread: decide now from the records, or return to re-raise."""
        with self._lock:
            self._stopping.set()
            error = short_error(exc)
            try:  # first, on disk: the launcher may stop this process before any verdict (see RankDeaths)
                write_exit_record(self.runtime, exc)
            except OSError:
                pass
            self.state = RankState.RUNNING
            self.runtime.current = fp
            records: dict[int, RankRecord] = {}
            try:
                assert self.link is not None
                own = replace(self.record(with_stack=True, error=error), waited=time.monotonic() - self.runtime.entered)
                self.link.publish(self.rank, own)
                control = self.link.read_control()
                if control.startswith("verdict"):
                    self.obey(control)
                deadline = time.monotonic() + 3.0
                weak: tuple[Verdict, dict[int, RankRecord]] | None = None
                while True:
                    records = self.link.read_all(self.world_size)
                    records[self.rank] = own
                    dead = self._dead(records)
                    records = merge_flight_files(self._with_exit_statuses(records, dead), dead, self.host)
                    records = refresh_from_flight(records, self.host, skip=dead | {self.rank})
                    verdict = decide(records, self.world_size, dead=dead, grace=0.0, hang_after=float("inf"))
                    if verdict is not None and verdict.decision.weak:
                        # "the peer is running elsewhere" right after the connection to it broke: it may
                        # be dying this very moment (a SIGKILLed process closes its sockets before it
                        # is a zombie). Give its death until the deadline to show.
                        weak = (verdict, records)
                    elif verdict is not None:
                        self.announce(verdict, records)
                    elif self._failed_alike(records, own):
                        # every peer failed in this same call with this same error: an argument every
                        # backend refuses (float8 for gloo), not a rank that is missing
                        weak = None
                        break
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
                    control = self.link.read_control()
                    if control.startswith("verdict"):
                        self.obey(control)
                if weak is not None:
                    self.announce(*weak)
            except Exception as exc2:  # noqa: BLE001 - the store may be gone with the peer that hosted it
                if os.environ.get("DDPDOCTOR_DEBUG"):
                    import traceback

                    traceback.print_exception(exc2)
                records = records_from_run_dir(self.runtime.run_dir, self.world_size)
                records[self.rank] = replace(self.record(with_stack=True, error=error), waited=0.0)
                dead = {r for r, rec in records.items() if rec.state is RankState.DEAD}
                verdict = decide(records, self.world_size, dead=dead, grace=0.0, hang_after=float("inf"))
                if verdict is not None and not os.path.exists(os.path.join(self.runtime.run_dir, REPORTED_MARK)):
                    publish_report(verdict, self.runtime, records)
                    stop_process(self.runtime, 1)
            self.runtime.current = None
            # Nothing decided: the error is re-raised. The monitor stays stopped, so that this rank's
            # record keeps the error while the process dies of it; if the program catches it and issues
            # another collective, the runtime resumes the monitor (`resume`).
            self.runtime.paused = self

    def resume(self) -> None:
        """Heartbeats and checks again, after a post-mortem whose error the program caught."""
        if self.link is None:
            return
        self._stopping.clear()
        threading.Thread(target=self.run, name="ddpdoctor-monitor", daemon=True).start()
