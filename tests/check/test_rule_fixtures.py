"""Every rule against its fixtures: the failing file yields exactly the findings marked in it, the fixed
file yields none, and `ddpdoctor rules CODE` shows the rule's page."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.catalogue import CATALOGUE
from ddpdoctor.check.local_imports import local_imports
from ddpdoctor.check.registry import all_rules
from ddpdoctor.cli import main

FIXTURES = Path(__file__).parent / "fixtures"

CODES = sorted(all_rules())
SECTIONS = ("## What it does", "## Why is this bad?", "## Example", "## Use instead", "## Fix safety",
            "## References")


def test_every_catalogue_rule_is_registered_and_no_other():
    # Derived from the catalogue's classes, never a hand-kept list: adding a rule touches its module, its
    # fixtures and its catalogue entry only.
    assert CODES == sorted(code for cls in CATALOGUE for code in cls.rules)


BAD = sorted(FIXTURES.glob("DDP*/bad*.py"))
GOOD = sorted(FIXTURES.glob("DDP*/good*.py"))
# A fixture directory is one project: its files are checked together, as `ddpdoctor check DIR` does.
BAD_DIRS = sorted(p for p in FIXTURES.glob("DDP*/bad_*") if p.is_dir())
GOOD_DIRS = sorted(p for p in FIXTURES.glob("DDP*/good_*") if p.is_dir())


def test_every_rule_has_failing_and_fixed_fixtures():
    assert {p.parent.name for p in BAD} == set(CODES) == {p.parent.name for p in GOOD}


@pytest.mark.parametrize("path", BAD, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_failing_fixture_has_exactly_the_marked_findings(check, expected, path):
    code = path.parent.name
    marked = expected(path)
    assert marked, f"{path} marks no expected finding"
    result = check(str(path), "--isolated", "--select", code, "--format", "json")
    assert result.code == 1, result.err
    assert {(f["line"], f["code"]) for f in result.findings} == marked
    for finding in result.findings:
        assert finding["class"] == all_rules()[code].class_slug
        assert finding["path"] == str(path)
        assert finding["column"] >= 1 and finding["end_line"] >= finding["line"]
        assert finding["message"]


@pytest.mark.parametrize("path", GOOD, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixed_fixture_is_clean(check, path):
    result = check(str(path), "--isolated", "--format", "json")
    assert result.findings == []
    assert result.code == 0


@pytest.mark.parametrize("directory", BAD_DIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_failing_fixture_directory_has_exactly_the_marked_findings(check, expected, directory):
    code = directory.parent.name
    marked = {(str(path), line, c) for path in sorted(directory.rglob("*.py")) for line, c in expected(path)}
    assert marked, f"{directory} marks no expected finding"
    result = check(str(directory), "--isolated", "--select", code, "--format", "json")
    assert result.code == 1, result.err
    assert {(f["path"], f["line"], f["code"]) for f in result.findings} == marked
    for finding in result.findings:
        assert finding["message"]


@pytest.mark.parametrize("directory", BAD_DIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_failing_fixture_directory_needs_its_other_files(check, expected, directory, tmp_path):
    """Each file alone shows nothing: the finding is made of more than one file. (Alone: copied to an
    empty folder, since `check FILE` reads the modules FILE imports from its project.)"""
    for number, path in enumerate(sorted(directory.rglob("*.py"))):
        folder = tmp_path / f"{number}-{path.stem}"  # (two `__init__.py` of one fixture get two folders)
        folder.mkdir()
        copy = folder / path.name
        copy.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
        alone = check(str(copy), "--isolated", "--select", directory.parent.name, "--format", "json")
        assert alone.findings == [], path


@pytest.mark.parametrize("directory", BAD_DIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_failing_fixture_directory_is_found_from_the_file_that_holds_the_finding(check, expected, directory):
    """`check FILE` on the file that holds the finding reads the modules it imports and finds it. Where the
    evidence lies only in a file that imports FILE (a helper module of a TRL program), FILE alone cannot
    show it: `check FILE` follows imports, not importers (docs/check.md)."""
    code = directory.parent.name
    for path in sorted(directory.rglob("*.py")):
        marked = {(str(path), line, c) for line, c in expected(path)}
        read = local_imports([str(path)], lambda _: False).modules
        if not marked or not any(Path(module).parent == directory for module in read):
            continue
        result = check(str(path), "--isolated", "--select", code, "--format", "json")
        assert {(f["path"], f["line"], f["code"]) for f in result.findings} == marked, path


@pytest.mark.parametrize("directory", GOOD_DIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixed_fixture_directory_is_clean(check, directory):
    result = check(str(directory), "--isolated", "--format", "json")
    assert result.findings == []
    assert result.code == 0


@pytest.mark.parametrize("code", CODES)
def test_rule_page(capsys, code):
    rule = all_rules()[code]
    for section in SECTIONS:
        assert section in rule.doc(), f"{code} page lacks {section}"
    assert rule.name and rule.summary and rule.class_slug
    assert main(["rules", code, "--format", "markdown"]) == 0
    page = capsys.readouterr().out
    assert page.startswith(f"# {code} `{rule.name}`")
    assert "## Why is this bad?" in page


def test_whole_fixture_tree_with_all_rules(check, expected):
    """All rules together over every fixture: no rule fires on another rule's fixtures unexpectedly."""
    marked = set()
    for path in BAD + [p for d in BAD_DIRS for p in sorted(d.rglob("*.py"))]:
        marked |= {(str(path), line, c) for line, c in expected(path)}
    result = check(*(str(FIXTURES / code) for code in CODES), "--isolated", "--format", "json")
    assert {(f["path"], f["line"], f["code"]) for f in result.findings} == marked
