"""The guard is invisible to correct programs: its threads live as long as the process group, and a program
that expects torch's error (monitored_barrier, a caught failure) gets it, reported but not stopped."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from guard_jobs import fixture_line, guarded, report_of, run_job, run_passing_job, torchrun

from ddpdoctor.findings import Severity


@pytest.fixture(scope="module")
def thread_life() -> str:
    result = run_passing_job(guarded(*torchrun("thread_life.py")), timeout=90)
    assert result.returncode == 0, result.output[-3000:]
    return result.output


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


def test_a_rank_in_monitored_barrier_gets_torchs_error_and_the_job_its_exit_code(tmp_path: Path) -> None:
    """torch's own test suite skips a monitored_barrier on purpose and expects its error: the guard reports
    the rank that is elsewhere, and lets monitored_barrier raise."""
    result = run_passing_job(
        guarded(*torchrun("handled_failures.py", "monitored-barrier"), report=tmp_path, hang_after=2),
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
        guarded(*torchrun("handled_failures.py", "caught"), report=tmp_path), proof="rank 1: done", timeout=90
    )
    assert result.returncode == 0, result.output[-3000:]
    assert "rank 0: caught" in result.output and "rank 0: done" in result.output, result.output[-3000:]
    [reported] = report_of(tmp_path)
    assert (reported.class_, reported.severity, reported.facts["handling"]) == (
        "dead-rank", Severity.WARNING, "caught"
    ), reported


def test_stop_always_stops_where_the_program_would_have_handled_it(tmp_path: Path) -> None:
    command = guarded(*torchrun("handled_failures.py", "monitored-barrier"), report=tmp_path, hang_after=2)
    command.insert(command.index("--"), "--stop-always")
    result = run_job(command, timeout=90)
    assert result.returncode == 1, result.output[-3000:]
    assert "torch said" not in result.output
    assert report_of(tmp_path)[0].severity is Severity.ERROR
