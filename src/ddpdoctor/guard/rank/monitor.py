"""The monitor of one rank: heartbeat, publish, judge on suspicion, report, stop the job.

Per heartbeat each rank does two store operations: `get` of the job's control key and `set` of its own
record. Only while a rank has waited in a collective longer than the grace period does anything read
the peers' records, and then only one rank (the *judge*, elected with `compare_set`) reads all of them.
The store is a separate client connection to the job's existing rendezvous store (no new server,
no new port), so the training thread never waits behind the monitor's traffic.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...audits import forward_counts
from ...failsafe import failsafe, swallowed
from ...records import RankRecord, RankState
from ..host import hosts_store, this_host
from ..judge.records import (
    exception_stack,
    merge_flight_files,
    short_error,
)
from ..protocol import Control, ControlValue, StoreKeys
from . import job_folder
from .consensus import ChainCheck
from .liveness import Liveness
from .long_sections import LongSectionNotes
from .monitor_thread import MonitorThread
from .own_record import own_record, write_meta
from .progress import MainThreadProgress
from .stop_policy import ReportOnly, handling_of
from .store_link import StoreLink

if TYPE_CHECKING:
    from ..judge.verdict import Verdict
    from .runtime import GuardRuntime

# Judging and reporting a failure (judge/verdict.py, outcome.py, postmortem.py, and through them the report's
# files and renderer) are imported where first used: by a rank that waits in a collective (its main thread
# is in C++, so the import does not compete with it), or that obeys a verdict or saw its collective raise.
# A clean job never loads them: they were 15-20 ms of CPU in every rank's `init_process_group`. Nor does
# the first heartbeat import them ahead of need: on a rank that works alone that import competes with the
# training thread for the GIL, and the heartbeats that show the rank moving would wait for it.

STALL_AFTER = 2.0  # seconds a heartbeat may wake late before this process counts as having been stopped


def scheduled_time() -> float | None:
    """Seconds of CPU this process has used (all threads) plus the seconds the calling thread has waited
    ready for a CPU (Linux's schedstat; None elsewhere). Neither grows while the process is stopped
    (SIGSTOP, a suspended machine): its threads neither run nor wait on a run queue. On a machine too busy
    to run the heartbeat on time, one of them does: the heartbeat thread waits on a run queue, or the thread
    holding the GIL runs."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as handle:
            queued = int(handle.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
    return time.process_time() + queued


class RankMonitor:
    """One rank's monitor: the heartbeat loop on a thread of its own (`start`), the judge's protocol, and
    the post-mortem the caller's thread runs when a collective raises."""

    def __init__(self, runtime: GuardRuntime) -> None:
        self.runtime = runtime
        self.config = runtime.config
        self.rank, self.world_size, _ = runtime.identity()
        self.host = this_host()
        self.heartbeats = 0
        self.is_judge = False
        self.state = RankState.RUNNING
        self._stopping = threading.Event()
        self._halted = False  # the thread was stopped from outside (`MonitorThread.stop`), the group lives on
        self._closed = False  # the last words were said (or the guard was uninstalled)
        self._thread: MonitorThread | None = None
        self.liveness = Liveness(self.rank, self.world_size, self.host, heartbeat=self.config.heartbeat,
                                 dead_after=self.config.dead_after, resumed=lambda: runtime.resumed)
        self._lock = threading.Lock()
        self.chain: ChainCheck = runtime.chain
        self.progress = MainThreadProgress(runtime.main_thread_id)  # slow or stuck (single-rank-long-section)
        self.long_sections = LongSectionNotes(runtime)
        self.link: StoreLink | None = None
        self.reported = ReportOnly()
        keys = StoreKeys(restart=self.config.restart, generation=runtime.generation)
        self.link = StoreLink(timeout=max(5.0, 6 * self.config.heartbeat), keys=keys)
        self.link.init()
        if self.config.report_dir and runtime.job is None:
            with failsafe("monitor: this job's report folder (its logs go to the top of the directory)"):
                runtime.job = job_folder.claim(self.link.store, keys, self.config.report_dir, self.rank)
                if runtime.job is not None:
                    job_folder.note(runtime.run_dir, self.rank, runtime.job)
        write_meta(runtime, self.host)
        # Published once from the caller's thread, so that a rank that dies within milliseconds (gloo's
        # SIGABRT on a size mismatch) has left its pid and flight-file path behind.
        self.link.publish(self.rank, self.record(with_stack=False))

    # ---- what this rank says about itself -----------------------------------------------------------
    def record(self, *, with_stack: bool, error: str | None = None) -> RankRecord:
        """This rank's state (see own_record.py)."""
        record = own_record(
            self.runtime, self.host, self.heartbeats, self.state, with_stack=with_stack, error=error
        )
        # sharded-step-divergence's evidence, with every heartbeat: a rank's count must be as fresh as the
        # collective it is in (a few bytes per wrapped root)
        return replace(record, still_for=self.progress.still_for(), progress_unknown=self.progress.unknown(),
                       passes=forward_counts.snapshot())

    # ---- the loop -----------------------------------------------------------------------------------
    def run(self) -> None:
        prepared = False
        try:
            while True:
                wait = self._next_wait()
                due = time.monotonic() + wait
                scheduled = scheduled_time()
                if self._stopping.wait(wait):
                    break
                self._note_stall(time.monotonic() - due, scheduled)
                started, scheduled = time.monotonic(), scheduled_time()
                self.tick()
                # a stop that lands during a tick (one that waits on the store) is a stall too: the next
                # wait's lateness would not show it
                self._note_stall(time.monotonic() - started, scheduled)
                if not prepared:
                    prepared = True
                    self._prepare()
        except Exception as exc:  # noqa: BLE001 - the store vanished, or a guard bug: fail open
            if self._stopping.is_set():
                swallowed("monitor: a heartbeat as the monitor stopped", exc)
            else:
                self.runtime.fail_open(exc)

    def _prepare(self) -> None:
        """After the first heartbeat, not at the group's start: the training thread is busy starting then,
        and a job that ends within a heartbeat (a test's) would wait for this at `destroy_process_group`."""
        try:
            # Import the renderer now, off the training thread, so a verdict prints without delay.
            import rich.console  # noqa: F401
            import rich.panel  # noqa: F401
            import rich.table  # noqa: F401
        except ImportError:
            pass
        with failsafe("monitor.run"):  # housekeeping only
            from ..config import scratch_dir
            from .leftovers import sweep

            # earlier jobs' files, in this thread: off the hot path
            sweep(scratch_dir(), keep=self.runtime.run_dir)

    def _next_wait(self) -> float:
        """A heartbeat, or less: wake up right when the collective in progress passes the grace period."""
        wait = self.config.heartbeat
        held = self.runtime.waiting()
        if held is not None:
            remaining = held[1] + self.config.grace - time.monotonic()
            if 0 < remaining < wait:
                wait = remaining + 0.01
        return wait

    def _note_stall(self, late: float, scheduled: float | None = None) -> None:
        """A heartbeat that woke far later than asked did not run: the process was stopped (Ctrl-Z, SIGSTOP)
        or the machine suspended, since a rank waiting in a collective holds no GIL that could keep this
        thread off. Waits and peers' silences then count from now (see GuardRuntime.waiting). Unless the
        process's threads ran or waited for a CPU meanwhile (`scheduled`: `scheduled_time()` before): a
        machine too busy to run this thread on time (load 15), not a stop of this process."""
        if late <= max(STALL_AFTER, 2 * self.config.heartbeat):
            return
        if scheduled is not None:
            now = scheduled_time()
            if now is not None and now - scheduled >= late / 2:
                return
        self.runtime.resumed = time.monotonic()

    def halt(self) -> None:
        """End the heartbeat loop only (a harness stopping the thread): the group's end still says the
        last words."""
        self._halted = True
        self._stopping.set()

    def stop(self, *, exited: bool, quiet: bool = False, at_interpreter_exit: bool = False) -> None:
        """The group ended (`exited`: destroyed, or the process leaves) or the guard is removed: the last
        record, then the thread, joined within a bounded time."""
        if self._closed or (self._stopping.is_set() and not self._halted):
            self._join()
            return
        self._closed = True
        self._stopping.set()
        with failsafe("monitor.stop: the warning of a long section still open"):
            self.long_sections.close()
        if exited and self.link is not None:
            fatal = self.runtime.fatal
            self.state = RankState.DEAD if fatal is not None else RankState.EXITED
            if not self._lock.acquire(timeout=2 * self.config.heartbeat + 6):
                return
            try:
                with failsafe(
                    "monitor.stop: the last record and chain check (the store may be gone at shutdown)"
                ):
                    self._last_words(fatal, at_interpreter_exit)
            finally:
                self._lock.release()
        self._join()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join_within()

    def _last_words(self, fatal: BaseException | None, at_interpreter_exit: bool) -> None:
        """This rank's last record, the final chain checkpoint, and letting go of the store it hosts."""
        assert self.link is not None
        record = self.record(with_stack=True, error=short_error(fatal) if fatal is not None else None)
        if fatal is not None:  # where it raised, not the interpreter's exit handlers
            record = replace(record, stack=exception_stack(fatal), gave_up=isinstance(fatal, SystemExit))
        elif at_interpreter_exit:  # the main thread runs only exit handlers: the user's frames are gone
            record = replace(record, stack=())
        self.link.publish(self.rank, record)
        self.check_chain(final=True)
        if hosts_store(self.link.store):
            self.link.leave(self.rank, self.world_size, self.config.heartbeat)

    def tick(self) -> None:
        assert self.link is not None
        with self._lock:
            self.heartbeats += 1
            self.progress.sample()
            control = self.link.read_control()
            if control.state is Control.VERDICT:
                self.obey(control)
                return
            # the rank hosting the store finished: cross-rank checks end here
            if control.state is Control.LEAVING:
                self.link.store.add(self.link.keys.let_go, 1)
                self.link = None
                self._stopping.set()
                return
            runtime = self.runtime
            held = runtime.waiting()
            waiting = held is not None and time.monotonic() - held[1] >= self.config.grace
            self.link.publish(self.rank, self.record(with_stack=waiting or control.state is Control.SUSPECT))
            self.check_chain()
            if waiting:
                if control.state is Control.IDLE:
                    self.link.move_control(Control.IDLE, Control.SUSPECT)
                if self.claim_judge():
                    self.judge()
            elif self.is_judge:
                self.long_sections.close()
                self.is_judge = False
                self.link.store.compare_set(self.link.keys.judge, str(self.rank), "")
                self.link.move_control(Control.SUSPECT, Control.IDLE)

    def check_chain(self, final: bool = False) -> None:
        """Compare this rank's completed collectives with the first rank's at each checkpoint."""
        if self.link is None:
            return
        ring = self.runtime.ring
        newest = ring.count  # read before `current`: a call written after it may be in progress
        self.chain.fold(ring, self.runtime.current, newest)
        if final:
            self.chain.flush()
        mismatch = self.chain.publish(self.link.store, self.link.keys)
        if mismatch is None:
            return
        from ..judge.verdict import chain_mismatch

        verdict = chain_mismatch(self.rank, *mismatch)
        if verdict is not None:
            self.announce(verdict, {})

    def claim_judge(self) -> bool:
        assert self.link is not None
        mine = str(self.rank)
        holder = self.link.store.compare_set(self.link.keys.judge, "", mine).decode()
        if holder != mine and holder:
            # Take over from a judge that stopped heartbeating (died, or its process is stuck): its
            # record's heartbeat count is read here, since only a judge reads every record.
            record = self.link.read(int(holder))
            if (
                self.liveness.silent_for(int(holder), record.hb if record is not None else 0)
                > self.config.dead_after
            ):
                holder = self.link.store.compare_set(self.link.keys.judge, holder, mine).decode()
        self.is_judge = holder == mine
        return self.is_judge

    def judge(self) -> None:
        assert self.link is not None
        records = self.link.read_all(self.world_size)
        dead = self.liveness.dead(records)
        records = self.liveness.with_silences(self.liveness.with_exit_statuses(records, dead), dead)
        records = merge_flight_files(records, dead, self.host)
        from ..judge.verdict import decide

        verdict = decide(
            records, self.world_size, dead=dead, grace=self.config.grace, hang_after=self.config.hang_after
        )
        if verdict is not None:
            self.announce(verdict, records)
        else:
            self.long_sections.observe(records, self.world_size, dead)

    # ---- after a verdict ----------------------------------------------------------------------------
    def announce(self, verdict: Verdict, records: dict[int, RankRecord]) -> None:
        """Claim the verdict and report it, or obey another rank's (outcome.py); this rank then stops. Where
        the program handles the failure itself, only reported (stop_policy.py)."""
        assert self.link is not None
        handling = handling_of(self.runtime)
        if not handling.stops:  # the program handles it: torch's error reaches it (stop_policy.py)
            self.reported.report(verdict, self.runtime, handling)
            return
        from .outcome import Outcome

        Outcome(self.link, self.runtime, self.config.heartbeat).announce(verdict, records)

    def obey(self, control: ControlValue) -> None:
        assert self.link is not None
        from .outcome import Outcome

        Outcome(self.link, self.runtime, self.config.heartbeat).obey(control)

    def post_mortem(self, fp: Any, exc: BaseException) -> None:
        """A collective raised in the caller's thread: decide now, or return for the error to be re-raised
        (see postmortem.py)."""
        from .postmortem import PostMortem

        PostMortem(self).run(fp, exc)

    def resume(self) -> None:
        """Heartbeats and checks again, after a post-mortem whose error the program caught."""
        if self.link is None or self._halted or self._closed:
            return
        self._join()  # the loop of before the post-mortem, which saw `_stopping`
        self._stopping.clear()
        self.start()

    def start(self) -> None:
        """Run the heartbeat loop on a daemon thread of its own (monitor_thread.py)."""
        self._thread = MonitorThread(self.run, self.halt)
        self._thread.start()
