"""`ddpdoctor check` in every format, on a real file of the catalogue's examples (its broken form, with the
fixed form beside it, which has nothing to report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sarif_shape import region, sarif_results

from ddpdoctor.findings import Finding, dumps, loads
from ddpdoctor.render.registry import formats_for
from ddpdoctor.reports import CheckReport

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "ddpdoctor" / "examples" / "collective-divergence"
BROKEN, FIXED = EXAMPLE / "broken.py", EXAMPLE / "fixed.py"


@pytest.fixture
def found(cli) -> list[Finding]:
    """The findings of the broken example, from `--format json` (read back with `loads`)."""
    result = cli("check", str(BROKEN), str(FIXED), "--format", "json")
    assert result.returncode == 1, result.stderr
    findings = loads(result.stdout)
    assert json.loads(dumps(findings)) == json.loads(result.stdout)  # the round trip loses nothing
    assert findings and {f.location.path for f in findings if f.location} == {str(BROKEN)}
    return findings


def test_text_names_each_findings_place_and_code_then_the_count(cli, found) -> None:
    result = cli("check", str(BROKEN), str(FIXED))
    assert result.returncode == 1
    for finding in found:
        loc = finding.location
        assert f"{loc.path}:{loc.line}:{loc.column}: {finding.code}" in result.stdout
        source_line = BROKEN.read_text(encoding="utf-8").splitlines()[loc.line - 1]
        assert f"{loc.line} | {source_line.expandtabs(1)}" in result.stdout  # the line, shown under it
    assert result.stdout.rstrip().endswith(f"Found {len(found)} finding{'s' if len(found) != 1 else ''}.")
    quiet = cli("check", str(BROKEN), str(FIXED), "--quiet")
    assert "Found" not in quiet.stdout and found[0].code in quiet.stdout


def test_sarif_has_one_result_per_finding_at_its_place(cli, found) -> None:
    results = sarif_results(cli("check", str(BROKEN), str(FIXED), "--format", "sarif").stdout)
    assert [(r["ruleId"], region(r)) for r in results] == [
        (f.code, (f.location.path, f.location.line)) for f in found]


def test_github_annotates_each_finding(cli, found) -> None:
    lines = cli("check", str(BROKEN), str(FIXED), "--format", "github").stdout.splitlines()
    assert len(lines) == len(found)
    for line, finding in zip(lines, found, strict=True):
        assert line.startswith(
            f"::{finding.severity.value} file={finding.location.path},line={finding.location.line},"
        )


def test_the_fixed_example_is_clean_in_every_format(cli) -> None:
    for fmt in formats_for(CheckReport):
        result = cli("check", str(FIXED), "--format", fmt)
        assert result.returncode == 0, (fmt, result.stdout, result.stderr)
        if fmt == "json":
            assert loads(result.stdout) == []
        elif fmt == "sarif":
            assert sarif_results(result.stdout) == []
        elif fmt == "text":
            assert result.stdout.strip() == "All checks passed!"
        elif fmt == "markdown":
            assert result.stdout.strip() == "ddpdoctor: no findings."
        else:
            assert result.stdout == ""


def test_markdown_lists_each_finding_at_its_place_with_its_fix(cli, found) -> None:
    markdown = cli("check", str(BROKEN), str(FIXED), "--format", "markdown").stdout
    items = [line for line in markdown.splitlines() if line.startswith("- ")]
    assert len(items) == len(found)
    for item, finding in zip(items, found, strict=True):
        assert item.startswith(f"- `{finding.location}`: **{finding.code}** ")
    assert finding.fix is not None and f"  - fix: {finding.fix.message}" in markdown


@pytest.mark.parametrize("fmt", ["html", "yaml"])
def test_a_format_check_does_not_have_is_a_usage_error(cli, fmt: str) -> None:
    result = cli("check", str(FIXED), "--format", fmt)
    assert result.returncode == 2 and "invalid choice" in result.stderr and "Traceback" not in result.stderr
