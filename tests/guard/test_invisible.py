"""The guard is invisible to correct programs: its threads live as long as the process group, and a program
that expects torch's error (monitored_barrier, a caught failure) gets it, reported but not stopped."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from guard_jobs import (
    DDPDOCTOR,
    SHARED_JOB_LANE,
    fixture_line,
    guarded,
    ranks,
    report_of,
    run_job,
    run_passing_job,
    two_clean_torchruns,
)

from ddpdoctor.findings import Severity


@pytest.fixture(scope="module")
def thread_life_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """Two default groups in turn in each rank's process (a pytest session's way): two jobs, one report
    directory."""
    report = tmp_path_factory.mktemp("thread_life") / "report"
    result = run_passing_job(guarded(*ranks("thread_life.py"), report=report), timeout=90)
    assert result.returncode == 0, result.output[-3000:]
    return result.output, report


@pytest.fixture(scope="module")
def thread_life(thread_life_run: tuple[str, Path]) -> str:
    return thread_life_run[0]


@pytest.mark.parametrize("rank", [0, 1])
def test_the_monitor_thread_lives_as_long_as_the_group_and_stops_on_request(
    thread_life: str, rank: int
) -> None:
    out = thread_life
    assert f"rank {rank}: first group: ['ddpdoctor-monitor daemon']" in out, out[-3000:]
    assert f"rank {rank}: after destroy: []" in out
    assert f"rank {rank}: 1 s after destroy: []" in out
    # one monitor per group: the second group's, not the first one's left over
    assert f"rank {rank}: second group: ['ddpdoctor-monitor daemon']" in out
    assert f"rank {rank}: stopped ddpdoctor-monitor: alive=False" in out
    assert f"rank {rank}: done: []" in out


def test_each_job_of_a_report_directory_keeps_its_own_rank_logs(thread_life_run: tuple[str, Path]) -> None:
    """The first group's logs are not overwritten by the second's: a folder per job, and `ddpdoctor report`
    shows the ranks of each."""
    _, report = thread_life_run
    assert sorted(p.name for p in report.iterdir()) == ["job-1", "job-2", "report.json"]
    for job, calls in (("job-1", 1), ("job-2", 2)):
        for rank in (0, 1):
            log = (report / job / f"rank-{rank}.jsonl").read_text()
            records = [json.loads(line) for line in log.splitlines()]
            assert [r["op"] for r in records] == ["all_reduce"] * calls, (job, rank, records)
    shown = run_job([*DDPDOCTOR, "report", str(report)], timeout=60)
    assert shown.returncode == 0, shown.output
    assert shown.output.index("job-1/: 2 rank(s)") < shown.output.index("job-2/: 2 rank(s)"), shown.output


@pytest.mark.xdist_group(SHARED_JOB_LANE)
def test_two_torchruns_of_one_command_keep_each_jobs_logs() -> None:
    """A script that runs two torchruns one after the other (on the same port, as a script's default
    would): each job's rank logs in a folder of its own, none overwritten."""
    shared = two_clean_torchruns()  # test_run_jobs.py reads its first job as the clean job
    result, report = shared.result, shared.report
    assert result.returncode == 0, result.output[-3000:]
    assert report_of(report) == []
    for job in ("job-1", "job-2"):
        for rank in (0, 1):
            log = (report / job / f"rank-{rank}.jsonl").read_text()
            assert [json.loads(line)["op"] for line in log.splitlines()][-3:] == ["all_reduce", "broadcast",
                                                                                 "barrier"], (job, rank)


def test_a_rank_in_monitored_barrier_gets_torchs_error_and_the_job_its_exit_code(tmp_path: Path) -> None:
    """torch's own test suite skips a monitored_barrier on purpose and expects its error: the guard reports
    the rank that is elsewhere, and lets monitored_barrier raise."""
    result = run_passing_job(
        guarded(*ranks("handled_failures.py", "monitored-barrier"), report=tmp_path, hang_after=2),
        proof="rank 1: done", timeout=90,
    )
    assert result.returncode == 0, result.output[-3000:]
    said = re.search(r"rank 0: torch said: .*Rank 1 failed to pass monitoredBarrier", result.output)
    assert said, result.output[-3000:]
    assert "rank 0: done" in result.output and "rank 1: done" in result.output
    findings = report_of(tmp_path)
    assert len(findings) == 1 and findings[0].severity is Severity.WARNING, findings
    reported = findings[0]
    assert reported.facts["handling"] == "monitored-barrier"
    assert "not stopped: monitored_barrier raises its own error" in reported.message
    line = fixture_line("handled_failures.py", "monitored")
    assert (reported.location.path.endswith("handled_failures.py"), reported.location.line) == (True, line)


def test_a_failure_the_program_catches_is_reported_and_left_to_the_program(tmp_path: Path) -> None:
    result = run_passing_job(
        guarded(*ranks("handled_failures.py", "caught"), report=tmp_path), proof="rank 1: done", timeout=90
    )
    assert result.returncode == 0, result.output[-3000:]
    assert "rank 0: caught" in result.output and "rank 0: done" in result.output, result.output[-3000:]
    [reported] = report_of(tmp_path)
    assert (reported.class_, reported.severity, reported.facts["handling"]) == (
        "dead-rank", Severity.WARNING, "caught"
    ), reported


def test_stop_always_stops_where_the_program_would_have_handled_it(tmp_path: Path) -> None:
    command = guarded(*ranks("handled_failures.py", "monitored-barrier"), report=tmp_path, hang_after=2)
    command.insert(command.index("--"), "--stop-always")
    result = run_job(command, timeout=90)
    assert result.returncode == 1, result.output[-3000:]
    assert "torch said" not in result.output
    assert report_of(tmp_path)[0].severity is Severity.ERROR
