"""A guarded run's report in every format: printed by `ddpdoctor run` while the job fails, and rendered again
from its --report directory by `ddpdoctor report DIR --format ...`. One real job (2 gloo ranks on the
CPU): rank 0 all_reduces 3 numbers where rank 1 all_reduces 5 (tests/guard/fixtures/collectives.py shape)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from sarif_shape import region, sarif_results
from shared_jobs import SHARED_JOB_LANE, shape_mismatch_job

from ddpdoctor.findings import Finding, dumps, loads
from ddpdoctor.render.registry import formats_for
from ddpdoctor.reports import RecordingReport

SCRIPT = Path(__file__).resolve().parents[1] / "guard" / "fixtures" / "collectives.py"


@dataclass
class GuardedRun:
    returncode: int
    output: str  # what `ddpdoctor run` printed (its report on stderr, merged)
    directory: Path  # its --report DIR
    findings: list[Finding]  # report.json, read back
    line: int  # the line of the mismatched all_reduce in the script


# the job is shared with tests/guard/test_run_jobs.py (its verdict and rank logs): one lane makes it once
pytestmark = pytest.mark.xdist_group(SHARED_JOB_LANE)


@pytest.fixture(scope="module")
def shape_run() -> GuardedRun:
    done = shape_mismatch_job()
    line = next(n for n, text in enumerate(SCRIPT.read_text().splitlines(), 1) if "# line: shape" in text)
    findings = loads((done.report / "report.json").read_text(encoding="utf-8"))
    return GuardedRun(done.returncode, done.output, done.report, findings, line)


def report(cli, run: GuardedRun, *args: str):
    return cli("report", str(run.directory), *args, env={"COLUMNS": "160"})


def test_run_prints_the_guards_panel_naming_each_ranks_line(shape_run: GuardedRun) -> None:
    assert shape_run.returncode != 0, shape_run.output
    assert [f.class_ for f in shape_run.findings] == ["collective-divergence"], shape_run.output
    assert "╭─ ddpdoctor: collective-divergence" in shape_run.output, shape_run.output
    place = f"collectives.py:{shape_run.line}"
    assert place in shape_run.output
    assert shape_run.findings[0].fix is not None
    assert " ".join(shape_run.findings[0].fix.message.split()[:4]) in " ".join(shape_run.output.split())


def test_report_json_is_the_runs_findings(cli, shape_run: GuardedRun) -> None:
    result = report(cli, shape_run, "--format", "json")
    assert result.returncode == 1, result.stderr  # the run had findings
    assert loads(result.stdout) == shape_run.findings
    assert dumps(loads(result.stdout)) == result.stdout.rstrip("\n")


def test_report_text_shows_findings_then_each_ranks_collectives(cli, shape_run: GuardedRun) -> None:
    result = report(cli, shape_run)
    assert result.returncode == 1
    assert result.stdout.startswith("collective-divergence ")
    for rank in (0, 1):
        assert f"rank {rank}: last " in result.stdout
    assert f"collectives.py:{shape_run.line}" in result.stdout


def test_report_sarif_and_github_point_at_each_ranks_line(cli, shape_run: GuardedRun) -> None:
    (result,) = sarif_results(report(cli, shape_run, "--format", "sarif").stdout)
    assert result["ruleId"] == "collective-divergence" and result["level"] == "error"
    places = {region(result, i) for i in range(len(result["locations"]))}
    assert (str(SCRIPT), shape_run.line) in places
    (annotation,) = report(cli, shape_run, "--format", "github").stdout.splitlines()
    assert (
        annotation.startswith(f"::error file={SCRIPT},line={shape_run.line}")
        and "title=collective-divergence" in annotation
    )


def test_report_html_goes_to_stdout_or_a_file(cli, shape_run: GuardedRun, tmp_path: Path) -> None:
    page = report(cli, shape_run, "--format", "html").stdout
    assert page.lstrip().lower().startswith("<!doctype html>") and "collective-divergence" in page
    target = tmp_path / "run.html"
    written = report(cli, shape_run, "--html", str(target))
    assert written.returncode == 1 and target.read_text(encoding="utf-8") == page.rstrip("\n") + "\n"
    both = report(cli, shape_run, "--html", str(target), "--format", "json")
    assert both.returncode == 2 and "give one of them" in both.stderr


def test_report_markdown_names_the_class_and_each_ranks_place(cli, shape_run: GuardedRun) -> None:
    markdown = report(cli, shape_run, "--format", "markdown").stdout
    assert markdown.startswith("**ddpdoctor: 1 finding**")
    assert "**collective-divergence**" in markdown
    assert f"{SCRIPT}:{shape_run.line}`" in markdown  # each rank's place, as code


@pytest.mark.parametrize("fmt", ["yaml"])
def test_a_format_report_does_not_have_is_a_usage_error(cli, shape_run: GuardedRun, fmt: str) -> None:
    assert fmt not in formats_for(RecordingReport)
    result = report(cli, shape_run, "--format", fmt)
    assert result.returncode == 2 and "invalid choice" in result.stderr and "Traceback" not in result.stderr
