"""What `ddpdoctor run` makes of a job once it is over: the findings its ranks left, a verdict after the fact
where nobody reported, the report printed and written, and the exit code. Imported while the job runs (see
launcher.py): none of it is needed to start the job.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from ...findings import Finding, Severity
from ...records import RankRecord, RankState
from ...render.audit_summary import render_summary
from ..judge.flight_files import read_flight
from ..judge.rank_rows import died_of_a_failed_collective
from ..judge.records import failed_alike, records_from_run_dir
from ..judge.verdict import Decision, decide, died_first
from ..protocol import Mark, RunDir
from ..rank import job_folder
from ..rank.job_folder import logs_folder
from ..report import collect_findings, render, write_rank_log, write_report
from .found_by_ranks import with_ranks
from .recap import recap_lines, recap_of

if TYPE_CHECKING:
    from .launcher import RunOptions


def conclude(
    options: RunOptions,
    run_dir: str,
    rc: int,
    died_before_the_rest: set[int] | None = None,
    statuses: dict[int, int] | None = None,
    interrupted: bool = False,
    outlived: set[int] | None = None,
) -> int:
    """Findings the ranks left, plus an after-the-fact verdict from the flight files if nobody reported.

    `died_before_the_rest`: the ranks seen gone while the others still ran (`RankDeaths.first`); the
    others were then stopped by the launcher, not dead of their own accord. `statuses`: the wait status
    of the ranks whose exit was seen in time (`RankDeaths.status`). `interrupted`: `ddpdoctor run` was sent
    SIGINT, SIGTERM, SIGHUP or SIGQUIT and passed it on; what the ranks reported stands, nothing is judged
    after.
    `outlived`: the ranks still running when the main process was gone, stopped by `ddpdoctor run` itself.
    """
    findings = with_ranks(collect_findings(run_dir), run_dir)
    records = records_from_run_dir(run_dir)
    new: list[Finding] = []
    if not RunDir(run_dir).has(Mark.REPORTED) and rc != 0 and records and not interrupted:
        records, finding = _judged_after_the_fact(records, findings, died_before_the_rest, statuses, outlived)
        if finding is not None:
            findings.insert(0, finding)
            new.append(finding)
    _print_report(options, run_dir, findings, new)
    if options.report_dir:
        try:
            write_report_dir(options.report_dir, findings, records, run_dir)
        except OSError as exc:  # the job's exit code is still the one to return
            print(f"[ddpdoctor] could not write the report into {options.report_dir}: {exc}", file=sys.stderr)
    if not records and not interrupted and distributed_launcher(options.command):
        print(f"[ddpdoctor] no process group was formed in this job{no_group_cause(options.command)}",
              file=sys.stderr, flush=True)
    _print_recap(options, findings, records)
    return _exit_code(options, rc, findings, new)


def _print_recap(options: RunOptions, findings: list[Finding], records: Mapping[int, RankRecord]) -> None:
    """The verdict again, as the last lines of the job's output (guard/launch/recap.py)."""
    report = RunDir(options.report_dir).report if options.report_dir else None
    recap = recap_of(findings, records, report)
    if recap is None:
        return
    try:
        lines = recap_lines(recap, distributed_launcher(options.command))
        print("\n".join(lines), file=sys.stderr, flush=True)
    except OSError:  # the terminal is gone (SIGHUP): the report files still hold it
        pass


def _judged_after_the_fact(
    records: dict[int, RankRecord],
    findings: list[Finding],
    died_before_the_rest: set[int] | None,
    statuses: dict[int, int] | None,
    outlived: set[int] | None,
) -> tuple[dict[int, RankRecord], Finding | None]:
    """A failed job nobody reported on: the records as the launcher saw the ranks end, and the verdict on
    them, if there is one."""
    world = max(records) + 1
    if failed_alike(records, world):
        return records, None
    first = died_before_the_rest or set()
    if any(r in records and (records[r].state is RankState.EXITED or records[r].gave_up) for r in first):
        first = set()  # the first to go left on its own (at its end, or by `sys.exit`): no death to blame
    first = first or raised_alone(records)
    records = {rank: _as_seen(record, (statuses or {}).get(rank),
                              bool((first and rank not in first) or rank in (outlived or set())))
               for rank, record in records.items()}
    # dead=set(): a rank that died first may itself have been the one waiting (gloo aborts a rank on a
    # size mismatch), so every rank with a collective in progress is judged.
    verdict = decide(records, world, dead=set(), grace=0.0, hang_after=float("inf"))
    if verdict is None and first and not any(f.severity == Severity.ERROR for f in findings):
        # Nobody waited: the launcher stopped the others first. The rank that went first is still the
        # job's failure (its traceback scrolls by in the log, among the launcher's own), unless a
        # rank's own error finding (F1's, raised by the guard) already says why it died.
        verdict = died_first(records, world, first)
    return records, verdict.finding() if verdict is not None else None


def _print_report(options: RunOptions, run_dir: str, findings: list[Finding], new: list[Finding]) -> None:
    """A rank that reported may have been stopped (torchrun's SIGTERM) before it finished printing: its
    files are there, and the report is printed from them here. Errors get a panel; warnings (the audits')
    were printed as one line by the rank that found them, and are in the summary."""
    panels: list[Finding] = []
    if not RunDir(run_dir).has(Mark.PRINTED):
        panels = [f for f in findings if f not in new and f.severity is Severity.ERROR] + new
        if panels:
            try:
                render(panels)
            except OSError:  # the terminal is gone (SIGHUP): the files still get the report
                pass
    if any(f.severity is not Severity.ERROR for f in findings):
        shown = panels if panels else [f for f in findings if f.severity is Severity.ERROR]
        report_path = RunDir(options.report_dir).report if options.report_dir else None
        try:
            render_summary(findings, shown=shown, report_path=report_path)
        except OSError:
            pass


def _exit_code(options: RunOptions, rc: int, findings: list[Finding], new: list[Finding]) -> int:
    # a rank's own exception is the job's failure, only named here: its exit code stays the job's
    named_only = rc != 0 and any(f.facts.get("kind") == Decision.RAISED_FIRST.value for f in new)
    if not named_only and any(f.severity == Severity.ERROR for f in findings):
        return 1
    if rc < 0:
        return 128 - rc
    if rc == 0 and findings and options.strict:  # warnings leave the exit code alone, unless asked
        return 1
    return rc


def raised_alone(records: Mapping[int, RankRecord]) -> set[int]:
    """The ranks that died of an uncaught exception (not of a collective another death broke) when no
    other rank has an error of its own or finished: the order of the deaths was not seen (the watcher
    woke after both), but only one side had something to die of; the others were stopped."""
    raised = {r for r, record in records.items() if record.state is RankState.DEAD and record.error
              and not record.gave_up and not died_of_a_failed_collective(record)}
    others = [record for r, record in records.items() if r not in raised]
    if (
        raised
        and others
        and all(
            record.state is not RankState.EXITED and (not record.error or died_of_a_failed_collective(record))
            for record in others
        )
    ):
        return raised
    return set()


_LAUNCHERS = frozenset({"torchrun", "accelerate", "accelerate-launch", "deepspeed", "torch.distributed.run",
                        "torch.distributed.launch"})


def distributed_launcher(command: list[str]) -> bool:
    """Whether the command starts a multi-process launcher, whose job is expected to form a process group.
    A plain `python tool.py` is not: a job that never meant to be distributed is left silent."""
    return any(os.path.basename(word) in _LAUNCHERS for word in command[:4])


def no_group_cause(command: list[str]) -> str:
    """The launcher's likely reason a job formed no process group, where the command shows it; else what
    it means."""
    words = [os.path.basename(word) for word in command]
    if "accelerate" in words or "accelerate-launch" in words:
        if "--cpu" in command and "--multi_gpu" not in command:
            return (
                ": `accelerate launch --cpu` starts one process whatever --num_processes says; for several "
                "ranks on CPU use `accelerate launch --multi_gpu --num_processes N` with "
                "`Accelerator(cpu=True)`"
            )
    return (": no process called init_process_group (or every one failed before it), so the guard had no "
            "ranks to watch")


def _as_seen(record: RankRecord, status: int | None, stopped_by_someone: bool) -> RankRecord:
    """A rank's record with what the launcher saw: its wait status, no wait (the job is over), and whether
    the launcher stopped it. A rank with an error of its own died of it, stopped or not; one whose error is
    the collective the dead rank broke ("Connection reset by peer") was a victim the launcher then stopped."""
    record = replace(record, exit_status=status if status is not None else record.exit_status,
                     waited=0.0 if record.current is not None else record.waited)
    if stopped_by_someone and record.state is RankState.DEAD and (
        not record.error or died_of_a_failed_collective(record)
    ):
        record = replace(record, state=RankState.STOPPED)
    return record


def write_report_dir(report_dir: str, findings: list[Finding], records: Mapping[int, RankRecord],
                     run_dir: str | None = None) -> None:
    """report.json, and rank-<r>.jsonl for every rank that did not write its own (a dead rank's, from its
    flight file), in its job's folder where the rank noted one in `run_dir`."""
    write_report(report_dir, findings)
    for name in os.listdir(report_dir):
        if name.startswith("report.json.tmp"):  # a rank stopped (SIGTERM by torchrun) mid-write
            try:
                os.unlink(os.path.join(report_dir, name))
            except OSError:
                pass
    for rank, record in records.items():
        folder = logs_folder(report_dir, job_folder.noted(run_dir, rank) if run_dir else None)
        if not os.path.exists(os.path.join(folder, f"rank-{rank}.jsonl")) and record.flight:
            write_rank_log(folder, rank, read_flight(record.flight))
