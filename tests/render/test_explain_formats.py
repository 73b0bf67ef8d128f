"""`ddpdoctor explain` in every format it offers, on real logs (tests/explain/fixtures): the JSON is the
documented Finding list with the diagnosis's decisions as facts, and the other formats say the same."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from sarif_shape import region, sarif_results

from ddpdoctor.catalogue import CATALOGUE
from ddpdoctor.explain import explain_paths, knowledge_base
from ddpdoctor.explain.report import explain_report
from ddpdoctor.findings import Evidence, Finding, dumps, loads
from ddpdoctor.render.registry import formats_for, render
from ddpdoctor.reports import ExplainReport

FIXTURES = Path(__file__).resolve().parents[1] / "explain" / "fixtures"
# rank 1 raises a KeyError in the user's script; rank 0 then loses its peer
RAISED = FIXTURES / "f6_rank_exception.log"
SIGKILL = FIXTURES / "f6_sigkill.log"  # rank 1 killed by SIGKILL: no traceback of the user's code


def text_of(report: ExplainReport, fmt: str = "text") -> str:
    buffer = io.StringIO()
    render(report, fmt, Console(file=buffer, width=120, no_color=True, highlight=False, soft_wrap=False))
    return buffer.getvalue()


def log_line(path: Path, number: int) -> str:
    return path.read_text(encoding="utf-8").splitlines()[number - 1]


def test_json_is_the_finding_list_and_round_trips(cli) -> None:
    result = cli("explain", str(RAISED), "--format", "json")
    assert result.returncode == 0, result.stderr
    findings = loads(result.stdout)
    assert findings and all(isinstance(f, Finding) for f in findings)
    assert json.loads(dumps(findings)) == json.loads(result.stdout)  # nothing lost or added by the round trip
    for finding in findings:
        assert finding.code == "" and finding.class_ in CATALOGUE
        assert finding.message == CATALOGUE.get(finding.class_).title
    confidences = [f.confidence for f in findings]
    assert all(c is not None and 0 < c < 1 for c in confidences)
    assert confidences == sorted(confidences, reverse=True)  # best first


def test_a_diagnosis_carries_its_decisions_as_facts_and_locations() -> None:
    best = explain_report(explain_paths([str(RAISED)])).findings[0]
    facts = best.facts
    assert best.class_ == "dead-rank"
    assert facts["culprit_rank"] == 1 and facts["exception"] == "KeyError"
    # the signature that decided it is one of its class's signatures in the catalogue
    signatures = {s.id for s in knowledge_base().for_slug(best.class_).signatures}
    assert facts["signature"] in signatures
    assert facts["what_happened"] and all(isinstance(s, str) for s in facts["what_happened"])
    assert best.fix is not None and best.fix.message not in facts["other_fixes"]
    # locations: the user's line first (as the traceback names it), then the log line that decided it
    user, in_log = best.locations
    assert f"{user.path}:{user.line}" == facts["user_frame"] and user.rank == 1
    assert in_log.path == str(RAISED) and in_log.rank == 1
    assert any(ev.line == in_log.line for ev in best.evidence)
    # display text derived from values, never the other way: the evidence is the log line, without a prefix
    assert best.evidence[0].text.strip() in log_line(RAISED, best.evidence[0].line)


def test_a_log_read_from_stdin_has_no_log_location_and_sarif_says_so(cli) -> None:
    as_json = cli("explain", "-", "--format", "json", stdin=SIGKILL.read_text(encoding="utf-8"))
    assert as_json.returncode == 0, as_json.stderr
    dead = loads(as_json.stdout)[0]
    assert dead.class_ == "dead-rank" and dead.locations == ()  # no file to point at
    as_sarif = cli("explain", "-", "--format", "sarif", stdin=SIGKILL.read_text(encoding="utf-8"))
    (result,) = sarif_results(as_sarif.stdout)
    assert result["ruleId"] == "dead-rank" and "locations" not in result
    as_github = cli("explain", "-", "--format", "github", stdin=SIGKILL.read_text(encoding="utf-8"))
    assert as_github.stdout.startswith("::error title=dead-rank::"), as_github.stdout


def test_sarif_and_github_point_at_the_users_line_and_the_log_line(cli) -> None:
    findings = loads(cli("explain", str(RAISED), "--format", "json").stdout)
    results = sarif_results(cli("explain", str(RAISED), "--format", "sarif").stdout)
    assert [r["ruleId"] for r in results] == [f.class_ for f in findings]
    best = findings[0]
    assert region(results[0], 0) == (best.locations[0].path, best.locations[0].line)
    assert region(results[0], 1) == (str(RAISED), best.locations[1].line)
    # the decisions travel with the result, and the rule (the failure class) is described by its title
    assert results[0]["properties"]["facts"]["culprit_rank"] == best.facts["culprit_rank"]
    assert results[0]["properties"]["confidence"] == best.confidence
    rules = json.loads(cli("explain", str(RAISED), "--format", "sarif").stdout)["runs"][0]["tool"]["driver"][
        "rules"
    ]
    assert {r["id"]: r["shortDescription"]["text"] for r in rules}[best.class_] == CATALOGUE.get(
        best.class_
    ).title
    lines = cli("explain", str(RAISED), "--format", "github").stdout.splitlines()
    assert len(lines) == len(findings)
    assert lines[0].startswith(f"::error file={best.locations[0].path},line={best.locations[0].line},")


def test_text_and_markdown_come_from_the_findings_alone(cli) -> None:
    """What the text and markdown show is in the JSON: rendered again from `--format json`'s output read back,
    they are the same."""
    report = explain_report(explain_paths([str(RAISED)]))
    from_json = replace(report, findings=tuple(loads(cli("explain", str(RAISED), "--format", "json").stdout)))
    for fmt in ("text", "markdown"):
        assert text_of(from_json, fmt) == text_of(report, fmt)


def test_text_shows_each_diagnosis_with_its_facts_fix_and_evidence() -> None:
    report = explain_report(explain_paths([str(RAISED)]))
    text = " ".join(text_of(report).split())  # undo the wrapping
    best = report.findings[0]
    assert text.startswith(f"read {report.lines_read:,} lines from {RAISED}: {len(report.findings)} diagnos")
    assert f"1. {best.class_} {CATALOGUE.get(best.class_).id} confidence {best.confidence:.2f}" in text
    assert "culprit_rank: 1" in text and "exception: KeyError" in text
    assert best.fix is not None and " ".join(best.fix.message.split()) in text
    # the facts the report adds are shown in their own places, not in the list of the log's facts
    for name in ("signature:", "what_happened:", "other_fixes:", "occurrences:"):
        assert name not in text
    assert f"line {best.evidence[0].line}: [rank 1]" in text


def test_markdown_keeps_the_logs_text_inside_its_table_and_its_code_block() -> None:
    """Text from a log can hold a `|`, a line break or backticks (a markdown-printing script's own fences):
    each fact stays one table row, each value one code span, and the evidence block is not ended early."""
    report = explain_report(explain_paths([str(FIXTURES / "accelerate_hooks_device.log")]))
    best = report.findings[0]
    odd = replace(best, facts={**best.facts, "note": "a | b\nc", "quoted": "x `y` z"},
                  evidence=(*best.evidence, Evidence("print('```')", line=99, rank=0)))
    markdown = text_of(replace(report, findings=(odd,)), "markdown")
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert "| note | `a \\| b c` |" in rows and "| quoted | ``x `y` z`` |" in rows
    assert "| device_a | `cuda:1` |" in rows
    assert all(re.fullmatch(r"\| \S+ \| .* \|", row) for row in rows)
    block = markdown.split("**Evidence**")[1].strip().splitlines()
    fence = block[0].removesuffix("text")
    assert len(fence) > 3 and set(fence) == {"`"}
    assert "99: [rank 0] print('```')" in block[1:block.index(fence)]


def test_nothing_diagnosed(cli, tmp_path: Path) -> None:
    log = tmp_path / "fine.log"
    log.write_text("Epoch 1: loss=0.3\n")
    as_json = cli("explain", str(log), "--format", "json")
    assert as_json.returncode == 1 and loads(as_json.stdout) == []
    as_sarif = cli("explain", str(log), "--format", "sarif")
    assert as_sarif.returncode == 1 and sarif_results(as_sarif.stdout) == []
    assert "no distributed-training failure" in as_sarif.stderr


@pytest.mark.parametrize("fmt", ["html", "yaml"])
def test_a_format_explain_does_not_have_is_a_usage_error(cli, fmt: str) -> None:
    assert fmt not in formats_for(ExplainReport)
    result = cli("explain", str(RAISED), "--format", fmt)
    assert result.returncode == 2 and "invalid choice" in result.stderr and "Traceback" not in result.stderr
