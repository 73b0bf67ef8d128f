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
    assert len(data) == len(CATALOGUE)
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


def test_code_examples_are_not_wrapped_at_the_terminal_width(cli):
    """An 80-column terminal: every line of the page's code blocks is shown whole, never cut in the middle of
    a statement (rich's Markdown wraps code blocks at the terminal's width)."""
    import re

    from ddpdoctor.check.pages import rule_page

    code_lines = [
        line.strip()
        for block in re.findall(r"^```\w*\n(.*?)^```", rule_page("DDP101"), re.M | re.S)
        for line in block.splitlines()
        if line.strip()
    ]
    assert any(len(line) > 76 for line in code_lines)  # the page has lines an 80-column terminal would wrap
    result = cli("rules", "DDP101", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    shown = {line.strip() for line in result.stdout.splitlines()}
    assert [line for line in code_lines if line not in shown] == []


def test_rules_piped_to_grep_without_columns_finds_each_class_whole():
    """`ddpdoctor rules | grep backend-device-mismatch` in a shell with no COLUMNS (a CI step): stdout is a
    pipe, and no slug or rule is cut (rich's default is 80 columns and an ellipsis)."""
    import os
    import subprocess
    import sys

    from ddpdoctor.check.registry import all_rules

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["NO_COLOR"] = "1"
    piped = subprocess.run(
        [
            "bash",
            "-c",
            'set -o pipefail; "$0" -m ddpdoctor rules | grep backend-device-mismatch',
            sys.executable,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert piped.returncode == 0, piped.stderr
    assert "F1" in piped.stdout and "DDP301 cpu-tensor-nccl-collective" in piped.stdout
    whole = subprocess.run([sys.executable, "-m", "ddpdoctor", "rules"], capture_output=True, text=True,
                           timeout=60, env=env)
    assert "…" not in whole.stdout
    lines = whole.stdout.splitlines()
    for cls in CATALOGUE:
        assert any(cls.id in line.split() and cls.slug in line for line in lines), cls.slug
        for code in cls.rules:
            assert any(f"{code} {all_rules()[code].name}" in line for line in lines), code
