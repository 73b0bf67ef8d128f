"""The guard's printed report where it usually ends up: a file, a pipe, a CI log. Every rank's `path:line`
is there whole, and a deep path keeps its file name and line in the stack column."""

from __future__ import annotations

from pathlib import Path

import pytest
from guard_jobs import SHARED_JOB_LANE, deep_elsewhere_job, fixture_line

from ddpdoctor.findings import Finding, Fix, Location, Severity
from ddpdoctor.guard.report import render

DEEP = "/home/ci/work/team-project/team-project/experiments/2026-11-24/sweep-17/nested/checkout/train.py"


def hang_finding() -> Finding:
    torch_frame = [
        "/opt/venv/lib/python3.12/site-packages/torch/autograd/graph.py",
        825,
        "_engine_run_backward",
        "torch",
    ]
    return Finding(
        class_="uneven-batches", severity=Severity.ERROR,
        message="rank 0 waits in barrier at train.py:31; rank 1 is in backward",
        locations=(Location(DEEP, 31, rank=0), Location(DEEP, 77, rank=1)),
        facts={"ranks": {
            "0": {"state": "in barrier (collective #3 of group 0)", "where": f"{DEEP}:31 in save_checkpoint",
                  "stack": [[DEEP, 31, "save_checkpoint", None], [DEEP, 80, "main", None]]},
            "1": {"state": "in backward", "stack": [torch_frame, [DEEP, 77, "main", None]]},
        }},
        fix=Fix("wrap the loop in `with Join([model]):`"),
    )


@pytest.mark.parametrize("columns", [None, "100"])
def test_a_deep_path_keeps_its_file_name_and_line_in_the_stack_column(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columns: str | None) -> None:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    with open(tmp_path / "report.txt", "w", encoding="utf-8") as handle:
        render([hang_finding()], handle)
    text = (tmp_path / "report.txt").read_text(encoding="utf-8")
    lines = text.splitlines()
    for line_number in (31, 80, 77):
        assert any(f"/checkout/train.py:{line_number}" in line for line in lines), (line_number, text)
    assert "…" not in text.replace("…/", "")  # nothing cut with an ellipsis
    assert "with Join([model]):" in text
    if columns is not None:
        assert max(len(line) for line in lines) <= int(columns)


@pytest.mark.xdist_group(SHARED_JOB_LANE)
def test_a_guard_report_written_to_a_file_names_each_ranks_path_and_line_whole() -> None:
    """A real job (torchrun, 2 gloo ranks) in a deep directory, its stderr redirected to a file, no COLUMNS:
    rank 0 waits in all_reduce, rank 1 sleeps elsewhere; each rank's place is in the file on one line."""
    run = deep_elsewhere_job()  # test_run_jobs.py reads its report.json
    result, script, text = run.result, run.script, run.stderr
    assert result.returncode != 0, result.output + text
    assert "╭─ ddpdoctor: collective-timeout" in text, result.output + text
    lines = text.splitlines()
    waits = fixture_line("collectives.py", "elsewhere") - 1  # rank 0's all_reduce, the line above the sleep
    sleeps = fixture_line("collectives.py", "elsewhere")
    for line_number in (waits, sleeps):
        assert any(f"{script}:{line_number}" in line for line in lines), (line_number, text)
        assert any(f"/checkout/collectives.py:{line_number}" in line for line in lines), (line_number, text)
    assert "…" not in text.replace("…/", "")
