"""What a rank does once the job's failure is decided: write the report's files, print it once, and
stop, aborting its process groups so that nobody waits for the backend's timeout."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ...failsafe import failsafe, swallowed
from ...findings import Finding
from ...records import RankRecord, RankState
from ..judge.flight_files import read_flight
from ..judge.verdict import Verdict
from ..protocol import Mark, RunDir
from ..report import merge_report, render, write_rank_log, write_report
from .job_folder import logs_folder

if TYPE_CHECKING:
    from .runtime import GuardRuntime


def write_own_log(runtime: GuardRuntime) -> None:
    if runtime.config.report_dir and runtime.rank is not None:
        with failsafe("publish: the pending collectives' last states"):
            runtime.async_work.settle()  # GPU collectives are asked about in batches: ask once more
        try:
            write_rank_log(logs_folder(runtime.config.report_dir, runtime.job), runtime.rank,
                           [fp.record() for fp in runtime.recent()])
        except OSError:
            pass


def report_findings(verdict: Verdict, runtime: GuardRuntime) -> list[Finding]:
    return [verdict.finding(), *runtime.findings]


def publish_report(verdict: Verdict, runtime: GuardRuntime, records: Mapping[int, RankRecord]) -> None:
    findings = report_findings(verdict, runtime)
    # The run directory is read back only by `ddpdoctor run`; outside it, only --report gets files.
    launched = runtime.config.launched and runtime.run_dir is not None
    deliver_report(
        findings,
        RunDir(runtime.identity()[2]) if launched else None,
        runtime.config.report_dir,
        runtime.rank,
        debug=runtime.config.debug,
    )
    write_own_log(runtime)
    if runtime.config.report_dir:
        for rank, record in records.items():
            if rank != runtime.rank and record.state is RankState.DEAD and record.flight:
                try:
                    write_rank_log(logs_folder(runtime.config.report_dir, runtime.job), rank,
                                   read_flight(record.flight))
                except OSError:
                    pass


def deliver_report(findings: list[Finding], run_dir: RunDir | None, report_dir: str | None, rank: Any,
                   debug: bool = False) -> None:
    """Files first, then the terminal: the launcher may SIGTERM this process at any moment (another rank
    died), and `ddpdoctor run` prints the report itself from the files if the `printed` mark is missing,
    but never a second time once it is there. `run_dir`: `ddpdoctor run`'s run directory (report.json and
    the marks), None outside it."""
    if run_dir:
        with contextlib.suppress(OSError):
            write_report(run_dir.path, findings)
    if report_dir:  # beside what the other ranks may have added there (install() has no launcher)
        with contextlib.suppress(OSError):
            merge_report(report_dir, findings[1:], lead=findings[0])
    if run_dir:
        run_dir.set_mark(Mark.REPORTED, rank)
    with sigterm_deferred():
        try:
            render(findings)
        except Exception as exc:  # noqa: BLE001 - rich failing must not hide the verdict
            if debug:
                raise
            swallowed("publish: rendering the report (printed plainly instead)", exc)
            print(f"[ddpdoctor] {findings[0].class_}: {findings[0].message} ({exc})", file=sys.stderr)
        sys.stderr.flush()
        if run_dir:
            run_dir.set_mark(Mark.PRINTED, rank)


def adopt_report(runtime: GuardRuntime, fetch: Callable[[], list[Finding] | None]) -> None:
    """A rank of another `ddpdoctor run` (another node) obeying a verdict: the judge's report goes into this
    run directory, for this launcher to print and return, as the judge's own launcher does. Without it,
    this launcher judged again from its own ranks' files alone, and a two-node job printed two different
    reports. Done once per run directory (the first of its ranks to obey); `fetch` reads the judge's
    findings from the store, None if it cannot."""
    if not runtime.run_dir or not runtime.config.launched:
        return
    run_dir = RunDir(runtime.run_dir)
    if run_dir.has(Mark.REPORTED):
        return
    try:
        if not run_dir.claim(Mark.ADOPTED):
            return  # another rank of this launcher does it
    except OSError:
        return
    findings = fetch()
    if findings:
        try:
            write_report(run_dir.path, findings)
        except OSError:
            return
        run_dir.set_mark(Mark.REPORTED, runtime.rank)


@contextlib.contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Hold a SIGTERM off until the block is done, then take it as it would have been taken.

    torchrun SIGTERMs the survivors 0.1 s after a rank dies, which is when the deciding rank prints: a
    rank stopped between printing the report and marking it printed had its report printed twice (once
    by it, once by `ddpdoctor run`), as CI saw. Only the main thread can change a handler; from the
    monitor thread the report is still written in one piece (`render`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is None:  # a handler installed from C could not be put back
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if caught:
            os.kill(os.getpid(), signal.SIGTERM)


def stop_process(runtime: GuardRuntime, code: int) -> None:
    """Abort the process group (nobody waits for the backend timeout) and leave at once."""
    sys.stderr.flush()
    sys.stdout.flush()
    runtime.exited = True
    with failsafe("publish.stop_process"):
        runtime.remove_files()
    aborter = threading.Thread(target=_abort_groups, daemon=True)
    aborter.start()
    aborter.join(1.0)
    os._exit(code)


def _abort_groups() -> None:
    with failsafe("publish._abort_groups"):  # best effort; os._exit follows
        import torch.distributed.distributed_c10d as c10d

        c10d._abort_process_group()
