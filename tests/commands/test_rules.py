import json

from ddpdoctor.catalogue import CATALOGUE


def test_rules_lists_all_classes(cli):
    result = cli("rules")
    assert result.returncode == 0, result.stderr
    for cls in CATALOGUE:
        assert cls.slug in result.stdout
    assert "DDP101" in result.stdout


def test_rules_json_lists_all_classes_with_their_codes(cli):
    data = json.loads(cli("rules", "--format", "json").stdout)
    assert len(data) == 11
    by_class = {entry["class"]: [r["code"] for r in entry["rules"]] for entry in data}
    assert by_class["collective-divergence"] == ["DDP101"]
    assert by_class["dead-rank"] == []


def test_class_page_by_id_and_by_slug_are_the_same(cli):
    by_id = cli("rules", "F1", "--format", "markdown")
    by_slug = cli("rules", "backend-device-mismatch", "--format", "markdown")
    assert by_id.returncode == 0
    assert by_id.stdout == by_slug.stdout
    assert "No backend type associated with device type cpu" in by_id.stdout
    assert "## Fixes" in by_id.stdout


def test_rule_page_shows_ruff_style_sections(cli):
    result = cli("rules", "DDP101")
    assert result.returncode == 0, result.stderr
    for heading in ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety"):
        assert heading in result.stdout
    assert "collective-divergence" in result.stdout


def test_unknown_key_is_a_usage_error_without_traceback(cli):
    result = cli("rules", "DDP999")
    assert result.returncode == 2
    assert "no failure class or rule named" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_subcommand_exits_2(cli):
    result = cli("frobnicate")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
