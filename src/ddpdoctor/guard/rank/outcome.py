"""After a verdict: the rank that claims it shares and prints the one report, waits for the others to see
it, and stops the job; every other rank obeys (leaves its rank log, acknowledges, stops)."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from ...failsafe import attempt, failsafe
from ...findings import dumps, loads
from ...records import RankRecord, RankState
from ..judge.verdict import Verdict
from ..protocol import Control, ControlValue, Mark, RunDir
from .publish import adopt_report, publish_report, report_findings, stop_process, write_own_log
from .store_link import StoreLink

if TYPE_CHECKING:
    from .runtime import GuardRuntime


class Outcome:
    def __init__(self, link: StoreLink, runtime: GuardRuntime, heartbeat: float) -> None:
        self.link = link
        self.runtime = runtime
        self.rank, self.world_size, _ = runtime.identity()
        self.wait = max(2.0, 4 * heartbeat)  # how long the judge waits for the others to see its verdict

    def announce(self, verdict: Verdict, records: dict[int, RankRecord]) -> None:
        """Claim the verdict; the winner prints the one report and writes it; then this rank stops. Not
        when `ddpdoctor run` is stopping the job on request (Ctrl-C, a scheduler's SIGTERM): a peer that
        signal ended first is not a dead rank."""
        if self.runtime.run_dir and RunDir(self.runtime.run_dir).has(Mark.STOPPING):
            return
        control = self.link.claim_verdict(self.rank)
        if control.state is not Control.VERDICT:
            return  # not claimed (the key would not hold still): decided again at the next heartbeat
        if control.judge != self.rank:
            self.obey(control)
            return
        # Before this rank prints: the ranks of other launchers (other nodes) take it from here; if it
        # cannot be shared, they judge from their own files.
        with failsafe("monitor.announce: sharing the report"):
            self.link.store.set(self.link.keys.report, json.dumps(
                {"run_dir": self.runtime.run_dir, "findings": dumps(report_findings(verdict, self.runtime))}))
        publish_report(verdict, self.runtime, records)
        # Let the peers see the verdict (this process may host the store) before going.
        deadline = time.monotonic() + self.wait
        gone = [r for r, row in verdict.rows.items() if r != self.rank and row.status.gone]
        alive = self.world_size - 1 - len(gone)
        link = self.link

        def all_acked() -> bool:
            return bool(link.store.add(link.keys.acks, 0) >= alive)

        while time.monotonic() < deadline:
            if attempt("monitor.announce: counting the acks", all_acked, True):
                break
            time.sleep(0.05)
        with failsafe("monitor.announce"):
            self.link.store.set(self.link.keys.released, "1")
        let_the_cause_go_first(verdict, records)
        stop_process(self.runtime, 1)

    def obey(self, control: ControlValue) -> None:
        judge = "?" if control.judge is None else control.judge
        self.runtime.current = None
        write_own_log(self.runtime)
        adopt_report(self.runtime, self.judges_report)
        with failsafe("monitor.obey"):
            # One line per job, not per rank (a thousand ranks would print a thousand): the first rank
            # to acknowledge says it for all of them.
            if self.link.store.add(self.link.keys.acks, 1) == 1:
                others = self.world_size - 1
                print(f"[ddpdoctor] stopping the job's other {others} rank{'s' if others != 1 else ''}; "
                      f"rank {judge} reported the job's failure", file=sys.stderr, flush=True)
            # This process may host the store (rank 0 under Lightning's launcher or mp.spawn): leaving
            # now would cut the judge off while it counts the acks, and torch would print a "Connection
            # reset by peer" stack trace under the report. One blocking wait, so that a judge that hosts
            # the store and leaves right after releasing it is not polled after it has gone.
            self.link.store.wait([self.link.keys.released], datetime.timedelta(seconds=self.wait + 1.0))
        stop_process(self.runtime, 1)

    def judges_report(self) -> list[Any] | None:
        """The findings the judge shared, unless it wrote them into this rank's own run directory."""
        with failsafe("monitor: reading the judge's report (the store is gone with the judge)"):
            self.link.store.wait([self.link.keys.report], datetime.timedelta(seconds=2))
            shared = json.loads(self.link.store.get(self.link.keys.report))
            if shared.get("run_dir") != self.runtime.run_dir:
                return loads(shared["findings"])
        return None



CAUSE_EXIT_WAIT = 5.0  # how long a judge waits for the rank it blames to finish leaving
# and then for torchrun's agent (polling every 0.1 s) to see that rank's failure alone
AGENT_NOTICE_WAIT = 3.0


def let_the_cause_go_first(verdict: Verdict, records: dict[int, RankRecord]) -> None:
    """A rank blamed for leaving (it died, or gave up with `sys.exit(3)`) may still be in its exit handlers
    when the judge has decided. Stopping now would make this rank the launcher's first failure: torchrun's
    "Root Cause" would name the judge with exit code 1 and the blamed rank as SIGTERMed (torchrun orders
    failures by whole seconds, and a tie goes to the lower rank). So wait, briefly, for the blamed ranks of
    this host to be gone, and under torchrun for its agent to stop this rank as it would without the guard;
    the report is out already."""
    from ..host import pid_alive, this_host

    blamed = [records.get(rank) for rank in (verdict.cause or verdict.peers)]
    pids = [r.pid for r in blamed if r is not None and r.pid and r.host == this_host()
            and r.state in (RankState.EXITED, RankState.DEAD)]
    if not pids:
        return
    deadline = time.monotonic() + CAUSE_EXIT_WAIT
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if pid_alive(pid)]
        if pids:
            time.sleep(0.05)
    if not pids and "TORCHELASTIC_RUN_ID" in os.environ:
        time.sleep(AGENT_NOTICE_WAIT)
