"""A 32-rank CPU job (slow: about a minute on 2 cores): the verdict's panel fits on one screen and names the
outlier's line, and the other ranks stop with one line for the job, not one per rank."""

from __future__ import annotations

from pathlib import Path

import pytest
from guard_jobs import fixture_line, guarded, report_of, run_job, torchrun


@pytest.mark.slow
def test_a_32_rank_job_reads_on_one_screen(tmp_path: Path) -> None:
    result = run_job(guarded(*torchrun("collectives.py", "rank-conditional", nproc=32), report=tmp_path,
                             hang_after=30), timeout=300)
    assert result.returncode == 1, result.output[-3000:]
    lines = result.output.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("╭─ ddpdoctor: collective-"))
    bottom = next(i for i in range(top, len(lines)) if lines[i].startswith("╰"))
    panel = lines[top : bottom + 1]
    assert len(panel) <= 25, "\n".join(panel)
    call = fixture_line("collectives.py", "conditional-call")
    assert any(f"collectives.py:{call}" in line for line in panel), "\n".join(panel)
    assert any("1–31 (31)" in line for line in panel), "\n".join(panel)
    assert sum("[ddpdoctor] stopping" in line for line in lines) == 1, result.output[-3000:]
    finding = next(f for f in report_of(tmp_path) if f.class_.startswith("collective"))
    assert len(finding.facts["ranks"]) == 32  # report.json keeps every rank's row
