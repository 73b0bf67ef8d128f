"""A rank that gives up with `sys.exit(3)` while its peer waits: the report names the exit, its status and
the user's line, and the launcher's own summary still names that rank as the root cause."""

from __future__ import annotations

import re
from pathlib import Path

from guard_jobs import fixture_line, guarded, ranks, report_of, run_job, run_passing_job, torchrun

from ddpdoctor.findings import Severity


def test_a_rank_that_calls_sys_exit_is_named_at_its_line_with_its_status(tmp_path: Path) -> None:
    result = run_job(guarded(*torchrun("gives_up.py"), report=tmp_path), timeout=90)
    assert result.returncode != 0, result.output[-3000:]
    findings = report_of(tmp_path)
    assert [f.class_ for f in findings] == ["dead-rank"], findings
    finding = findings[0]
    assert finding.severity is Severity.ERROR
    exit_line = fixture_line("gives_up.py", "exit")
    assert f"rank 1 exited with sys.exit(3) at gives_up.py:{exit_line}" in finding.message
    assert "while rank 0 waits in all_reduce" in finding.message
    assert finding.fix is not None and "sys.exit" in finding.fix.message
    assert any(loc.rank == 1 and loc.line == exit_line for loc in finding.locations), finding.locations
    # torchrun's summary: rank 1 (status 3) is the first failure, not the rank the guard stopped
    root = result.output.split("Root Cause", 1)[-1]
    assert re.search(r"rank\s*:\s*1 .*?exitcode\s*:\s*3", root, re.S), result.output[-3000:]


def test_ranks_that_stop_together_are_clean(tmp_path: Path) -> None:
    result = run_passing_job(guarded(*ranks("gives_up.py", "fixed"), report=tmp_path), "rank 1: done")
    assert result.returncode == 0, result.output[-3000:]
    assert report_of(tmp_path) == []
