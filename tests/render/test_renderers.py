"""Renderers take any list of Finding (static, runtime, explain) and produce text for people or tools."""

from __future__ import annotations

import io
import json

from rich.console import Console
from sarif_shape import sarif_results

from ddpdoctor.findings import Applicability, Edit, Evidence, Finding, Fix, Location, Severity, loads
from ddpdoctor.render import render
from ddpdoctor.render.github import render_github
from ddpdoctor.render.registry import formats_for
from ddpdoctor.render.sarif import render_sarif
from ddpdoctor.render.text import render_text, summary_line
from ddpdoctor.reports import CheckReport


def static_finding(path: str) -> Finding:
    return Finding(
        class_="collective-divergence", code="DDP101", message="a collective only rank 0 reaches",
        locations=(Location(path, 2, 5, 2, 20),),
        fix=Fix("use rank_zero_only=True", (Edit(path, 2, 5, 2, 20, "x"),), Applicability.SAFE),
    )


def runtime_finding() -> Finding:
    return Finding(
        class_="collective-divergence", message="rank 0 waits in all_reduce, rank 1 in barrier",
        severity=Severity.ERROR,
        locations=(Location("train.py", 11, rank=0), Location("train.py", 9, rank=1)),
        evidence=(Evidence("all_reduce([3], float32)", line=11, rank=0), Evidence("barrier()", rank=1)),
    )


def console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=100, no_color=True, highlight=False), buffer


def test_text_shows_location_code_source_span_and_fix(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f(t):\n    dist.all_reduce(t)\n", encoding="utf-8")
    out, buffer = console()
    render_text([static_finding(str(source))], out)
    text = buffer.getvalue()
    assert f"{source}:2:5: DDP101 [*] a collective only rank 0 reaches" in text
    assert "2 |     dist.all_reduce(t)" in text
    assert "|     ^^^^^^^^^^^^^^^" in text
    assert "= fix: use rank_zero_only=True" in text


def test_text_renders_runtime_findings_with_ranks_and_evidence():
    out, buffer = console()
    render_text([runtime_finding()], out)
    text = buffer.getvalue()
    assert "[rank 0] train.py:11: collective-divergence rank 0 waits in all_reduce" in text
    assert "rank 0: line 11: all_reduce([3], float32)" in text or "rank 0 line 11: all_reduce" in text
    assert "= also at [rank 1] train.py:9" in text


def test_text_escapes_rich_markup():
    finding = Finding(class_="x", message="[bold]not markup[/bold]", locations=(Location("[a].py", 1),))
    out, buffer = console()
    render_text([finding], out)
    assert "[bold]not markup[/bold]" in buffer.getvalue()


def test_json_round_trips():
    out, buffer = console()
    findings = [static_finding("m.py"), runtime_finding()]
    render(findings, "json", out)
    assert loads(buffer.getvalue()) == findings


def test_sarif_is_valid_2_1_0_shape():
    text = render_sarif([static_finding("src/m.py"), runtime_finding()])
    assert len(sarif_results(text)) == 2
    log = json.loads(text)
    assert log["version"] == "2.1.0"
    results = log["runs"][0]["results"]
    assert results[0]["ruleId"] == "DDP101" and results[0]["level"] == "error"
    assert results[0]["locations"][0]["physicalLocation"]["region"] == {
        "startLine": 2, "startColumn": 5, "endLine": 2, "endColumn": 20}
    assert results[1]["ruleId"] == "collective-divergence"
    assert len(results[1]["locations"]) == 2
    assert {r["id"] for r in log["runs"][0]["tool"]["driver"]["rules"]} == {"DDP101", "collective-divergence"}


def test_github_annotations_escape_properties_and_data():
    finding = Finding(class_="c", code="DDP402", severity=Severity.WARNING, message="100% wrong\nsecond line",
                      locations=(Location("a,b:c.py", 3, 1),))
    line = render_github([finding])
    assert line.startswith("::warning file=a%2Cb%3Ac.py,line=3,col=1,title=DDP402 c::")
    assert "100%25 wrong%0Asecond line" in line
    assert "\n" not in line


def test_every_format_renders_an_empty_list():
    for fmt in formats_for(CheckReport):
        out, buffer = console()
        render([], fmt, out)
    assert summary_line(0, 0, 0) == "All checks passed!"
    assert summary_line(2, 1, 1).startswith("Found 2 findings.")
